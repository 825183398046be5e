"""The Triton DAG kernels (fadat/kernels/triton_dag.py) against fadat.dag's PyTorch path, on the
CPU through Triton's interpreter (float32, the kernels' fixed launch configuration and a smaller
tile that makes L ≤ 32 span several tiles).

Triton fixes compiler-or-interpreter for the whole process when it is first imported, so this
module sets ``TRITON_INTERPRET=1`` at collection on machines without CUDA (where Triton cannot
compile anyway and nothing else in the suite runs Triton). On a CUDA machine it is skipped unless
the interpreter was asked for: there tests/test_cuda.py tests the compiled kernels.
"""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch

from fadat import dag
from fadat.kernels import triton_dag

if not triton_dag.triton_importable():
    pytest.skip("triton is not installed (pip install -e '.[dev]')", allow_module_level=True)
if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip(
        "CUDA is available: the compiled kernels are tested in tests/test_cuda.py "
        "(set TRITON_INTERPRET=1 to run these interpreter tests here)",
        allow_module_level=True,
    )
if "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"

import triton.language as tl  # noqa: E402  (after TRITON_INTERPRET is set)

if type(tl.zeros).__name__ != "InterpretedFunction":
    pytest.skip(
        "triton was imported before TRITON_INTERPRET=1 was set; run this file on its own",
        allow_module_level=True,
    )

NEG_INF = float("-inf")
F64 = torch.float64

# Tile edges: the production launch configuration, and 8 so that L ≤ 32 spans up to four tiles
# (online logsumexp across tiles, ties across tiles, the tile-skipping loop bounds).
BLOCKS = [triton_dag.BLOCK, 8]

# Ragged batches: a full-width graph, shorter ones, one with T_b = L_b (a single path), one with
# T_b > L_b (no path), one of a single vertex and target.
CASES = [
    ([32, 29, 17, 12, 8], [16, 11, 17, 5, 9]),
    ([23, 1, 9, 20], [7, 1, 9, 20]),
]


def random_case(seed: int, glen: list[int], tlen: list[int], vocab: int = 6, padding: float = 7.0):
    """float64 (match, links, graph_lengths, target_lengths) from random model-like outputs:
    log-softmax tokens, masked log-softmax links, a few −inf match entries (as force-emit
    leaves), ``padding`` in every entry off the graph or past ``T_b`` (a log-probability > 0
    that would change every result if it were read)."""
    gen = torch.Generator().manual_seed(seed)
    glen_t, tlen_t = torch.tensor(glen), torch.tensor(tlen)
    batch, size, steps = len(glen), max(glen), max(tlen)
    logp = torch.log_softmax(torch.randn(batch, size, vocab, generator=gen, dtype=F64) * 2, -1)
    targets = torch.randint(0, vocab, (batch, steps), generator=gen)
    match = dag.gather_match(logp, targets)  # (B, T, L)
    idx = torch.arange(size)
    valid = (idx[None, :, None] < idx[None, None, :]) & (idx[None, None, :] < glen_t[:, None, None])
    scores = torch.randn(batch, size, size, generator=gen, dtype=F64) * 2
    links = torch.log_softmax(scores.masked_fill(~valid, -1e9), -1).masked_fill(~valid, NEG_INF)
    # −inf at a few interior (step, vertex) pairs, never on a single-path graph (T_b = L_b),
    # so that every sentence with T_b ≤ L_b keeps a path.
    steps_idx = torch.arange(steps)[None, :, None]
    interior = (steps_idx > 0) & (steps_idx < tlen_t[:, None, None] - 1)  # (B, T, 1)
    pinned = (torch.rand(batch, steps, size, generator=gen) < 0.05) & interior
    pinned &= (tlen_t != glen_t)[:, None, None]
    match = match.masked_fill(pinned, NEG_INF)
    off_graph = idx[None, None, :] >= glen_t[:, None, None]  # (B, 1, L)
    past_end = torch.arange(steps)[None, :, None] >= tlen_t[:, None, None]  # (B, T, 1)
    match = match.masked_fill(off_graph | past_end, padding)
    links = links.masked_fill(idx[None, :, None] >= glen_t[:, None, None], padding)
    return match, links, glen_t, tlen_t


@pytest.fixture(params=BLOCKS, ids=lambda b: f"block{b}")
def block(request, monkeypatch):
    monkeypatch.setattr(triton_dag, "BLOCK", request.param)
    return request.param


@pytest.mark.parametrize("seed,case", [(0, CASES[0]), (1, CASES[1])])
def test_log_likelihood_values_and_gradients_equal_dag(block, seed, case):
    """float32 kernel vs the float64 PyTorch path (itself checked against path enumeration in
    tests/test_dag.py). Tolerances: log P is a sum of ≤ 32 float32 logsumexps of terms of size
    ≤ 100, so ≈ 32 · 100 · 6e-8 ≈ 2e-4 absolute at worst (1e-5 relative); the gradients are
    posteriors in [0, 1], each ``exp`` of a float32 sum of that size, summed over ≤ 32 steps:
    2e-5 absolute."""
    match, links, glen, tlen = random_case(seed, *case)
    weights = torch.randn(len(glen), dtype=F64, generator=torch.Generator().manual_seed(seed))

    m64, l64 = match.clone().requires_grad_(), links.clone().requires_grad_()
    ref = dag.dag_log_likelihood_from_match(m64, l64, glen, tlen, backend="torch")
    (ref.nan_to_num(neginf=0.0) * weights).sum().backward()

    m32, l32 = match.float().requires_grad_(), links.float().requires_grad_()
    out, stats = dag.dag_log_likelihood_from_match(
        m32, l32, glen, tlen, return_stats=True, backend="triton"
    )
    assert out.dtype == torch.float32
    assert stats == dag.LikelihoodStats(too_short=int((tlen > glen).sum()), underflow_recomputed=0)
    assert torch.equal(torch.isinf(out), tlen > glen)  # −inf exactly where no path exists
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=2e-4)
    (out.nan_to_num(neginf=0.0) * weights.float()).sum().backward()

    torch.testing.assert_close(m32.grad.double(), m64.grad, rtol=0, atol=2e-5)
    torch.testing.assert_close(l32.grad.double(), l64.grad, rtol=0, atol=2e-5)
    no_path = tlen > glen
    assert not m32.grad[no_path].any() and not l32.grad[no_path].any()


def test_log_space_kernels_are_exact_where_the_float32_exp_space_path_recomputes(block):
    """Links so peaked (a path needs jumps of ≈ 10 vertices at 8 nats per vertex of deviation
    from 1) that the PyTorch float32 path's scaled exp-space DP loses the path and recomputes
    both sentences in float64 (``underflow_recomputed = 2``): the kernels' float32 log-space DP
    needs no recomputation and gives log P ≈ −240 to 1e-6 relative (5e-8 measured), gradients
    to 2e-5."""
    size, steps, vocab = 32, 4, 7
    gen = torch.Generator().manual_seed(11)
    glen, tlen = torch.tensor([size, size - 3]), torch.tensor([steps, steps - 1])
    idx = torch.arange(size, dtype=F64)
    scores = -8.0 * (idx[None, :] - idx[:, None] - 1).abs()  # (L, L)
    scores = scores + 0.1 * torch.randn(2, size, size, generator=gen, dtype=F64)
    valid = (idx[None, :, None] < idx[None, None, :]) & (idx[None, None, :] < glen[:, None, None])
    links = torch.log_softmax(scores.masked_fill(~valid, -1e9), -1).masked_fill(~valid, NEG_INF)
    logp = torch.log_softmax(torch.randn(2, size, vocab, generator=gen, dtype=F64) * 3, -1)
    match = dag.gather_match(logp, torch.randint(0, vocab, (2, steps), generator=gen))

    _, stats = dag.dag_log_likelihood_from_match(
        match.float(), links.float(), glen, tlen, return_stats=True, backend="torch"
    )
    assert stats.underflow_recomputed == 2
    m64, l64 = match.clone().requires_grad_(), links.clone().requires_grad_()
    ref = dag.dag_log_likelihood_from_match(m64, l64, glen, tlen, backend="torch")
    ref.sum().backward()
    assert (ref < -200).all()
    m32, l32 = match.float().requires_grad_(), links.float().requires_grad_()
    out, stats = dag.dag_log_likelihood_from_match(
        m32, l32, glen, tlen, return_stats=True, backend="triton"
    )
    out.sum().backward()
    assert stats.underflow_recomputed == 0
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-6, atol=0)
    torch.testing.assert_close(m32.grad.double(), m64.grad, rtol=0, atol=2e-5)
    torch.testing.assert_close(l32.grad.double(), l64.grad, rtol=0, atol=2e-5)


def test_kernels_never_read_padding(block):
    """NaN in every entry off the graph, past ``T_b`` or below the diagonal (which the PyTorch
    path does not promise to survive) leaves the kernels' values, gradients and paths exactly
    as with finite padding: those entries are never loaded."""
    outputs = []
    for padding in (7.0, math.nan):
        match, links, glen, tlen = random_case(0, [24, 13, 9], [9, 7, 10], padding=padding)
        below = torch.ones(links.shape[1], links.shape[1], dtype=torch.bool).tril()
        links = links.masked_fill(below, padding)
        m, lk = match.float().requires_grad_(), links.float().requires_grad_()
        out = dag.dag_log_likelihood_from_match(m, lk, glen, tlen, backend="triton")
        out.nan_to_num(neginf=0.0).sum().backward()
        path = dag.best_alignment_from_match(
            match.float(), links.float(), glen, tlen, backend="triton"
        )
        outputs.append((out.detach(), m.grad, lk.grad, path))
    for clean, dirty in zip(*outputs, strict=True):
        assert torch.equal(clean, dirty)


def test_log_likelihood_gradient_scales_with_upstream_gradient(block):
    """The backward multiplies by the upstream gradient per sentence (checked against 1·)."""
    match, links, glen, tlen = random_case(2, [20, 14], [9, 6])
    m = match.float().requires_grad_()
    out = dag.dag_log_likelihood_from_match(m, links.float(), glen, tlen, backend="triton")
    out.sum().backward()
    once = m.grad.clone()
    m.grad = None
    out = dag.dag_log_likelihood_from_match(m, links.float(), glen, tlen, backend="triton")
    (out * torch.tensor([-2.0, 0.5])).sum().backward()
    torch.testing.assert_close(m.grad[0], -2.0 * once[0])
    torch.testing.assert_close(m.grad[1], 0.5 * once[1])


@pytest.mark.parametrize("seed,case", [(0, CASES[0]), (1, CASES[1])])
def test_best_alignment_equals_dag(block, seed, case):
    """Same float32 max-plus sums in the same order as the PyTorch path, so the paths agree
    exactly (not only in score)."""
    match, links, glen, tlen = random_case(seed, *case)
    match, links = match.float(), links.float()
    ref = dag.best_alignment_from_match(match, links, glen, tlen, backend="torch")
    out = dag.best_alignment_from_match(match, links, glen, tlen, backend="triton")
    assert torch.equal(out, ref)
    assert ((out >= 0).sum(1) == torch.where(tlen <= glen, tlen, 0)).all()


def test_best_alignment_ties_go_to_the_lowest_vertex(block):
    """All paths equally likely (uniform match, links 0 on the triangle): every tie is broken
    towards the lowest source vertex, as the PyTorch path does, including across tiles."""
    size, steps = 30, 6
    glen, tlen = torch.tensor([size, 25]), torch.tensor([steps, 4])
    idx = torch.arange(size)
    upper = (idx[:, None] < idx[None, :]).float().log()  # 0 on the triangle, −inf elsewhere
    links = upper.expand(2, size, size).contiguous()
    match = torch.zeros(2, steps, size)
    ref = dag.best_alignment_from_match(match, links, glen, tlen, backend="torch")
    out = dag.best_alignment_from_match(match, links, glen, tlen, backend="triton")
    assert torch.equal(out, ref)
    # lowest vertices first, then the end vertex
    assert out[0, : steps - 1].tolist() == list(range(steps - 1)) and out[0, size - 1] == steps - 1


def test_full_likelihood_and_alignment_route_through_backend():
    """dag_log_likelihood / best_alignment (from token log-probabilities) pass ``backend`` on."""
    gen = torch.Generator().manual_seed(3)
    glen, tlen = torch.tensor([12, 9]), torch.tensor([5, 4])
    logp = torch.log_softmax(torch.randn(2, 12, 7, generator=gen), -1)
    scores = torch.randn(2, 12, 12, generator=gen)
    below = torch.ones(12, 12, dtype=torch.bool).tril()
    links = torch.log_softmax(scores.masked_fill(below, -1e9), -1)  # rows of L_b − 1 ignored
    targets = torch.randint(0, 7, (2, 5), generator=gen)
    a = dag.dag_log_likelihood(logp, links, targets, glen, tlen, backend="triton")
    b = dag.dag_log_likelihood(logp, links, targets, glen, tlen, backend="torch")
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)
    p = dag.best_alignment(logp, links, targets, glen, tlen, backend="triton")
    q = dag.best_alignment(logp, links, targets, glen, tlen, backend="torch")
    assert torch.equal(p, q)


def test_forced_triton_rejects_float64():
    match, links, glen, tlen = random_case(0, [6], [3])
    with pytest.raises(ValueError, match="float32"):
        dag.dag_log_likelihood_from_match(match, links, glen, tlen, backend="triton")


_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fadat.kernels import _triton_dag_jit as K

pointers = {"back_ptr": "*i32", "path_ptr": "*i64", "glen_ptr": "*i64", "tlen_ptr": "*i64"}
scalars = {"steps": "i32", "size": "i32", "BLOCK_I": "constexpr", "BLOCK_J": "constexpr"}
done = []
for arch in json.loads(sys.argv[1]):
    for name in ("forward_kernel", "backward_kernel", "links_grad_kernel", "viterbi_kernel"):
        fn = getattr(K, name)
        sig = {a: pointers.get(a) or scalars.get(a) or "*fp32" for a in fn.arg_names}
        src = ASTSource(fn, sig, constexprs={"BLOCK_I": 32, "BLOCK_J": 32})
        out = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 4})
        done.append([arch, name, len(out.asm["cubin"]) > 0])
print(json.dumps(done))
"""


def test_kernels_compile_to_cubin_without_a_gpu():
    """The compiler (not the interpreter) accepts the kernels: Triton's front end (constexpr-only
    globals, loop-carried types), its NVIDIA back end and the bundled ptxas turn each into a
    cubin for sm_80 (A100) and sm_90 (H100), in a fresh process without TRITON_INTERPRET."""
    import json
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # today's default, stated (silences a notice)
    archs = [80, 90]
    out = subprocess.run(
        [sys.executable, "-c", _COMPILE, json.dumps(archs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    done = json.loads(out.stdout.strip().splitlines()[-1])
    kernels = ["forward_kernel", "backward_kernel", "links_grad_kernel", "viterbi_kernel"]
    assert done == [[a, k, True] for a in archs for k in kernels]
