"""Evaluation: quality and speed of systems side by side (:mod:`.evaluate`, ``fadat evaluate``),
the metrics and the dataset splits they read (:mod:`.scoring`), the valid-set metrics of the
synthetic corpus (:mod:`.validset_metrics`), the paper's confidence analyses (:mod:`.analysis`)
and pictures of a translation's graph (:mod:`.show_graph`, ``fadat show-graph``). ``log P(y|x)``
of given pairs is :meth:`fadat.Translator.score` (``fadat score``). Nothing is imported here; the
command line of these verbs is in :mod:`fadat.cli`.
"""
