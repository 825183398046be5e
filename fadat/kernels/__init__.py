"""Optional compiled kernels for the DAG programmes of :mod:`fadat.dag`.

Each kernel has its plain PyTorch reference in :mod:`fadat.dag` and randomized equivalence tests
against it (tests/test_triton_dag.py). Nothing here is imported unless a kernel is selected.
"""
