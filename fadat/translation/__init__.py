"""Translation workflows on top of the models and decoders: the pipeline shared by ``fadat
translate``, ``score``, ``evaluate``, ``analyze`` and the server (:mod:`.pipeline`: encoding,
length-sorted batches, precision and shortlist, translating and scoring), the Python API
(:mod:`.translator`, exported as ``fadat.Translator``), sequence-level distillation with the AT
(:mod:`.distill`) and the AT's export to CTranslate2 (:mod:`.export`). Nothing is imported here.
"""
