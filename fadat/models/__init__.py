"""The networks: the translation-model interface and its registry (:mod:`.architectures`), the
shared Transformer layers (:mod:`.transformer`), each architecture in its own module (DAT
:mod:`.dat`, the autoregressive baseline :mod:`.at`, vanilla NAT :mod:`.nat`, CTC :mod:`.ctc`),
their configuration (:mod:`.config`), model directories (:mod:`.directory`), and the DAT's fast
inference path (:mod:`.inference`, :mod:`.shortlist`).

Nothing is imported here: ``fadat.models.architectures`` loads an architecture's module only
when a model of that type is built or loaded.
"""
