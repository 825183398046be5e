"""Training: the one loop (:mod:`.trainer`), its configuration (:mod:`.config`), the run
directory's files (:mod:`.checkpoints`, :mod:`.average`), its logs (:mod:`.run_log`), several
processes (:mod:`.distributed`), validation (:mod:`.validation`) and the model a run starts from
(:mod:`.model_init`). The objectives are :mod:`fadat.objectives`; the ``fadat train`` flags are
:mod:`fadat.cli.train`. Nothing is imported here.
"""
