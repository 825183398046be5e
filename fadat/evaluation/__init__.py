"""Evaluation: quality and speed of systems side by side (:mod:`.evaluate`), the metrics and the
dataset splits they read (:mod:`.scoring`), the valid-set metrics of the synthetic corpus
(:mod:`.validset_metrics`), ``log P(y|x)`` of given pairs (:mod:`.score`, ``fadat score``), the
paper's confidence analyses (:mod:`.analysis`) and pictures of a translation's graph
(:mod:`.show_graph`, ``fadat show-graph``). Nothing is imported here.
"""
