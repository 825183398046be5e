"""fadat on CUDA against fadat on the CPU (issue 31, item 1). Skipped where no CUDA device exists.

- the DAG math (log P(y|x) and its gradients through both backends, the best alignment, the
  passing probabilities and the fuzzy loss for n = 1–3) equals the CPU float64 results;
- every decoder gives the CPU's outputs on the same graph, and the released model's graph and
  translations on CUDA are the CPU's;
- a training step (fp32, bf16 autocast, fp16 autocast + GradScaler) gives the CPU fp32 step's
  loss and gradients within the tolerance of its precision, and ``fadat train --device cuda``
  gives the CPU run's losses;
- a model saved from CUDA loads on the CPU and back bit for bit; CUDA RNG states survive a
  checkpoint.

Each tolerance says why it is what it is. ``FADAT_TEST_DEVICE=cpu`` runs this file with ``cpu``
in place of ``cuda`` (CPU against CPU; the Triton cases are skipped): a dry run of the tests' own
logic and tolerances on a machine without a GPU. It proves nothing about CUDA.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from test_dag import link_logprobs, make_case
from test_decoding import random_graph

from fadat import dag
from fadat.cli import main
from fadat.data.contract import BOS_ID, EOS_ID, make_batch, pad_sequences
from fadat.decoding import STRATEGIES, decode
from fadat.kernels import triton_dag
from fadat.models.config import make_config
from fadat.models.dat import DATModel
from fadat.models.directory import load_pretrained
from fadat.models.inference import graph_top1
from fadat.objectives import ObjectiveConfig, compute_loss
from fadat.training.checkpoints import (
    CHECKPOINT_FORMAT,
    atomic_save,
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
)

DEVICE = torch.device(os.environ.get("FADAT_TEST_DEVICE", "cuda"))
ON_CUDA = DEVICE.type == "cuda"

pytestmark = pytest.mark.skipif(
    ON_CUDA and not torch.cuda.is_available(),
    reason="no CUDA device (torch.cuda.is_available() is False); these tests run on a GPU",
)

F32, F64 = torch.float32, torch.float64
NEG_INF = float("-inf")
ROOT = Path(__file__).resolve().parent.parent
RELEASED = ROOT / "models" / "bible-en-es-fadat-cpu-small"
TEST_50 = ROOT / "tests" / "data" / "bible-en-es-test-50.en"

# Triton runs compiled only on CUDA tensors; on the CPU it would need the interpreter
# (tests/test_triton_dag.py).
TRITON = pytest.param(
    "triton",
    marks=pytest.mark.skipif(
        not (ON_CUDA and triton_dag.triton_importable()),
        reason="the compiled Triton kernels need CUDA tensors and the triton package",
    ),
)
BACKENDS = ["torch", TRITON]

# Ragged graphs larger than one 32-vertex Triton tile; T_b = L_b (one path) in sentence 1 and
# T_b > L_b (no path) in sentence 3.
GLEN, TLEN = [40, 33, 17, 8, 30], [20, 33, 9, 10, 12]


def dag_inputs(seed: int, vocab: int = 7):
    """CPU float64 ``(token_logprobs, links, targets, graph_lengths, target_lengths)``."""
    logits, scores, targets, glen, tlen = make_case(seed, GLEN, TLEN, vocab=vocab)
    return (
        logits.detach().log_softmax(-1),
        link_logprobs(scores.detach(), glen),
        targets,
        glen,
        tlen,
    )


def on_device(*tensors: torch.Tensor, dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """Copies on DEVICE, floating ones in ``dtype`` (if given)."""
    return [
        t.to(DEVICE, dtype) if dtype is not None and t.is_floating_point() else t.to(DEVICE)
        for t in tensors
    ]


def leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_()


def close(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> None:
    """``got`` (any device and dtype) against the CPU float64 ``want``."""
    torch.testing.assert_close(got.detach().cpu().double(), want.detach(), rtol=rtol, atol=atol)


# Tolerances of a DAG quantity computed on DEVICE in dtype against the CPU in float64:
# - float64: the same algorithm with other reduction orders and libm: ~1e-15 per operation;
#   1e-10 leaves five orders of magnitude for the ≤ 40-step recursions.
# - float32: unit roundoff 6e-8; log P sums ≤ 33 logsumexps of terms of size ≤ 100 (≈ 2e-4
#   absolute at worst, ≈ 1e-5 relative); gradients are posteriors in [0, 1] summed over ≤ 33
#   steps (2e-5 absolute). The CPU float32 path meets the same (tests/test_dag.py).
DAG_TOL = {F64: {"rtol": 1e-10, "atol": 1e-10}, F32: {"rtol": 1e-5, "atol": 2e-4}}
GRAD_TOL = {F64: {"rtol": 1e-9, "atol": 1e-10}, F32: {"rtol": 0.0, "atol": 2e-5}}


# ------------------------------------------------------------------------------ DAG math


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_log_likelihood_and_gradients_equal_cpu_float64(backend, dtype):
    if backend == "triton" and dtype == F64:
        pytest.skip("the Triton kernels run in float32 only")
    lp, links, targets, glen, tlen = dag_inputs(1)
    weights = torch.linspace(0.5, 2.0, len(GLEN), dtype=F64)
    cpu_lp, cpu_links = leaf(lp), leaf(links)
    ref = dag.dag_log_likelihood(cpu_lp, cpu_links, targets, glen, tlen, backend="torch")
    finite = torch.isfinite(ref)
    assert finite.tolist() == [True, True, True, False, True]
    want = torch.autograd.grad(torch.where(finite, ref * weights, 0.0).sum(), (cpu_lp, cpu_links))

    d_lp, d_links = (leaf(t) for t in on_device(lp, links, dtype=dtype))
    d_targets, d_glen, d_tlen, d_weights = on_device(targets, glen, tlen, weights.to(dtype))
    out = dag.dag_log_likelihood(d_lp, d_links, d_targets, d_glen, d_tlen, backend=backend)
    assert out.device.type == DEVICE.type and out.dtype == dtype
    assert torch.isneginf(out.cpu()).tolist() == (~finite).tolist()  # −inf, never NaN
    close(out.cpu()[finite], ref[finite], **DAG_TOL[dtype])
    weighted = torch.where(torch.isfinite(out), out * d_weights, 0.0).sum()
    got = torch.autograd.grad(weighted, (d_lp, d_links))
    tol = GRAD_TOL[dtype]
    if backend == "triton":
        # The kernels form each posterior as exp(α + β − log P) from values of size up to
        # |log P| (205 here), so its relative error is a few float32 ulps of |log P|, not of the
        # posterior: 8 · 2⁻²⁴ · max |log P| ≈ 1e-4 (4 roundings, twice over). Measured on an
        # H100 (torch 2.11): 4.6e-5 relative, where PyTorch's autograd, whose local softmaxes
        # never form such sums, stays under 3e-7 absolute.
        tol = {"rtol": 8 * 2.0**-24 * ref[finite].abs().max().item(), "atol": tol["atol"]}
    for g, w in zip(got, want, strict=True):
        assert torch.isfinite(g).all()
        close(g, w, **tol)


@pytest.mark.parametrize("auto_uses_triton", [False, True])
def test_auto_backend_on_cuda_runs_the_triton_kernels(monkeypatch, auto_uses_triton):
    """``backend="auto"`` sends float32 CUDA tensors to the Triton kernels when triton is
    installed and ``AUTO_USES_TRITON`` is set (True since this file passed on an H100),
    float64 ones (and every CPU tensor) to the PyTorch path."""
    if not (ON_CUDA and triton_dag.triton_importable()):
        pytest.skip("needs CUDA and the triton package")
    monkeypatch.setattr(triton_dag, "AUTO_USES_TRITON", auto_uses_triton)
    calls = []
    real = triton_dag.log_likelihood
    monkeypatch.setattr(
        triton_dag, "log_likelihood", lambda *a: calls.append(a[0].dtype) or real(*a)
    )
    lp, links, targets, glen, tlen = dag_inputs(2)
    for dtype in (F32, F64):
        dag.dag_log_likelihood(*on_device(lp, links, targets, glen, tlen, dtype=dtype))
    assert calls == ([F32] if auto_uses_triton else [])


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_best_alignment_equals_cpu(backend, dtype):
    """Exactly the CPU's paths in the same dtype: the max-plus recursion is additions and
    maxima only, which IEEE arithmetic rounds identically on every device and order."""
    if backend == "triton" and dtype == F64:
        pytest.skip("the Triton kernels run in float32 only")
    for seed in (3, 4):
        lp, links, targets, glen, tlen = dag_inputs(seed)
        want = dag.best_alignment(lp.to(dtype), links.to(dtype), targets, glen, tlen)
        got = dag.best_alignment(
            *on_device(lp, links, targets, glen, tlen, dtype=dtype), backend=backend
        )
        assert got.device.type == DEVICE.type
        assert torch.equal(got.cpu(), want)
        assert (want[3] == -1).all()  # T_b > L_b: no path
        assert torch.equal(want[1], torch.arange(40).where(torch.arange(40) < 33, -1))  # T_b = L_b


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("order", [1, 2, 3])
def test_fuzzy_alignment_and_passing_probabilities_equal_cpu_float64(order, dtype):
    """Every FuzzyAlignment field and the gradient of the score. float32 tolerances: the CPU
    float32 test's for the values (rtol 1e-5, atol 1e-6; triangular solves and matmuls over ≤ 40
    vertices); the gradients (entries up to ~1) get atol 1e-5."""
    lp, links, targets, glen, tlen = dag_inputs(10 + order, vocab=5)
    cpu_lp, cpu_links = leaf(lp), leaf(links)
    ref = dag.fuzzy_alignment(cpu_lp, cpu_links, targets, glen, tlen, order=order)
    want = torch.autograd.grad(ref.score.sum(), (cpu_lp, cpu_links))
    passing = dag.passing_probabilities(links, glen)

    d_lp, d_links = (leaf(t) for t in on_device(lp, links, dtype=dtype))
    d_targets, d_glen, d_tlen = on_device(targets, glen, tlen)
    out = dag.fuzzy_alignment(d_lp, d_links, d_targets, d_glen, d_tlen, order=order)
    got = torch.autograd.grad(out.score.sum(), (d_lp, d_links))
    value_tol = {"rtol": 1e-10, "atol": 1e-12} if dtype == F64 else {"rtol": 1e-5, "atol": 1e-6}
    grad_tol = {"rtol": 1e-9, "atol": 1e-11} if dtype == F64 else {"rtol": 1e-4, "atol": 1e-5}
    for name in dag.FuzzyAlignment._fields:
        assert getattr(out, name).dtype == dtype
        close(getattr(out, name), getattr(ref, name), **value_tol)
    for g, w in zip(got, want, strict=True):
        close(g, w, **grad_tol)
    close(dag.passing_probabilities(d_links.detach(), d_glen), passing, **value_tol)


# ------------------------------------------------------------------------------ decoders

STRATEGY_OPTIONS = {"sample": {"seed": 3}}


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_decoder_on_device_gives_the_cpu_outputs(strategy, dtype):
    """Same graph, same dtype: the same paths, tokens and (up to summation order) scores. The
    decisions are comparisons of sums formed in the same order (sampling and beam search draw
    on the host's numpy RNG / run on the host), so they are exact; scores are sums of ≤ 30
    terms (rel 1e-5 in float32, 1e-12 in float64)."""
    lp, links, lengths = random_graph(6, 30, 40, seed=5)
    lp, links = lp.to(dtype), links.to(dtype)
    options = STRATEGY_OPTIONS.get(strategy, {})
    want = decode(lp, links, lengths, strategy, **options)
    got = decode(*on_device(lp, links, lengths), strategy, **options)
    rel = 1e-5 if dtype == F32 else 1e-12
    for g, w in zip(got, want, strict=True):
        assert (g.tokens, g.path, g.path_tokens) == (w.tokens, w.path, w.path_tokens)
        assert g.score == pytest.approx(w.score, rel=rel, abs=rel)


@pytest.fixture(scope="module")
def released():
    if not (RELEASED / "config.json").exists():
        pytest.skip("no released model")
    from fadat.data.spm import encode_source
    from fadat.translation.translator import Translator

    translator = Translator.from_pretrained(RELEASED)
    lines = TEST_50.read_text(encoding="utf-8").splitlines()[:16]
    return translator.model, pad_sequences([encode_source(translator.sp, x) for x in lines])


def test_released_model_graph_on_device_equals_cpu(released):
    """The network's outputs: fp32 GEMMs in another accumulation order over d ≤ 512 and a few
    layers differ by ~1e-6 relative; 1e-4 absolute on log-probabilities leaves margin (TF32 is
    off for matmuls by default in torch; with it on this fails, as it should)."""
    model, source = released
    device_model = load_pretrained(RELEASED, map_location=DEVICE)
    with torch.inference_mode():
        want = model.graph_outputs(source)
        got = device_model.graph_outputs(source.to(DEVICE))
    assert torch.equal(got[2].cpu(), want[2])  # graph sizes
    for g, w in zip(got[:2], want[:2], strict=True):
        finite = torch.isfinite(w)
        assert torch.equal(torch.isfinite(g).cpu(), finite)
        torch.testing.assert_close(g.cpu()[finite], w[finite], rtol=0, atol=1e-4)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_released_model_translates_on_device_as_the_cpu_decodes_its_graph(released, strategy):
    """``translate_batch`` on CUDA (the fast top-1 path for greedy / lookahead / Viterbi /
    joint-Viterbi) gives what the CPU decoders give on the graph that CUDA computed: decoding
    is compared exactly, without the network's rounding differences."""
    _, source = released
    device_model = load_pretrained(RELEASED, map_location=DEVICE)
    options = STRATEGY_OPTIONS.get(strategy, {})
    with torch.inference_mode():
        lp, links, lengths = device_model.graph_outputs(source.to(DEVICE))
        got = device_model.translate_batch(source.to(DEVICE), strategy, options)
    want = decode(lp.cpu(), links.cpu(), lengths.cpu(), strategy, **options)
    assert [g[0][0] for g in got] == [w.tokens for w in want]
    for g, w in zip(got, want, strict=True):
        assert g[0][1] == pytest.approx(w.score, rel=1e-5, abs=1e-5)
    if strategy != "greedy":  # the fast path's per-vertex best tokens are the full path's
        top1, _, _ = graph_top1(device_model, source.to(DEVICE))
        s, tok = lp.max(-1)
        real = torch.arange(s.shape[1], device=DEVICE)[None, :] < lengths[:, None]
        assert torch.equal(top1.tok[real], tok[real])
        torch.testing.assert_close(top1.s[real], s[real], rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------ training step

V = 24


def tiny_model() -> DATModel:
    torch.manual_seed(0)
    return DATModel(make_config("tiny", V, dropout=0.0))


def train_batch():
    """Six pairs of different lengths, one of them too long for its graph (T_b > L_b)."""
    gen = torch.Generator().manual_seed(0)
    sources, targets = [], []
    for n_src, n_tgt in ((5, 6), (3, 4), (7, 9), (2, 2), (6, 5), (2, 9)):
        sources.append(torch.randint(4, V, (n_src,), generator=gen).tolist() + [EOS_ID])
        body = torch.randint(4, V, (n_tgt,), generator=gen).tolist()
        targets.append([BOS_ID, *body, EOS_ID])
    return make_batch(sources, targets, list(range(len(sources))))


def step_gradients(model, batch, objective: str, precision: str):
    """Loss (per sentence) and unscaled gradients of one training step in ``precision`` on the
    model's device, as fadat.training.trainer does it (autocast around compute_loss; GradScaler for
    fp16). For fp16 also returns the scaler's scale after ``step``/``update``."""
    device = next(model.parameters()).device
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model.zero_grad(set_to_none=True)
    cfg = ObjectiveConfig(name=objective, glancing_ratio=0.0)
    with torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype is not None):
        out = compute_loss(model, batch.to(device), cfg)
    loss = out.loss_sum / out.count
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    grads = {n: p.grad.detach().cpu().double() for n, p in model.named_parameters()}
    scaler.step(optimizer)
    scaler.update()
    return float(loss.detach()), grads, scaler.get_scale() if precision == "fp16" else None


# Tolerances against the CPU fp32 step, as (loss, all gradients, one parameter's gradient), each
# relative: |Δloss| / |loss|; ‖ΔG‖ / ‖G‖ over all parameters; ‖Δg‖ / ‖g‖ for each parameter
# whose gradient is ≥ 1e-3 ‖G‖ (others, such as the links head's key bias whose exact gradient
# is 0, are rounding noise; they count in ‖ΔG‖). fp32 differs in accumulation order only (~1e-6
# per GEMM). bf16 rounds every matmul input to 8 significant bits (unit roundoff 3.9e-3), fp16
# to 11 (4.9e-4); the DAG math stays fp32. Measured with bf16 / fp16 autocast on the CPU
# (FADAT_TEST_DEVICE=cpu): loss 1.4e-4 / 7.7e-6, all 2.2e-3 / 2.9e-4, one 4.8e-3 / 5.7e-4.
# CUDA's autocast casts a few more ops (attention runs as bf16/fp16 SDPA there), so the limits
# are ~10x those.
STEP_TOL = {
    "fp32": (1e-5, 1e-4, 1e-3),
    "bf16": (5e-3, 2e-2, 5e-2),
    "fp16": (1e-3, 4e-3, 1e-2),
}


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("objective", ["nll", "fuzzy"])
def test_training_step_on_device_matches_the_cpu_fp32_step(objective, precision):
    batch = train_batch()
    want_loss, want, _ = step_gradients(tiny_model(), batch, objective, "fp32")
    model = tiny_model().to(DEVICE)
    loss, got, scale = step_gradients(model, batch, objective, precision)
    loss_tol, all_tol, one_tol = STEP_TOL[precision]
    assert loss == pytest.approx(want_loss, rel=loss_tol)
    assert got.keys() == want.keys()
    assert all(torch.isfinite(g).all() for g in got.values())
    flat_got = torch.cat([got[k].flatten() for k in want])
    flat_want = torch.cat([w.flatten() for w in want.values()])
    assert float((flat_got - flat_want).norm() / flat_want.norm()) <= all_tol
    for name, w in want.items():
        if w.norm() >= 1e-3 * flat_want.norm():
            err = float((got[name] - w).norm() / w.norm())
            assert err <= one_tol, (name, err)
    if precision == "fp16":
        assert scale == 2.0**16  # no overflow was found: the step was taken, the scale kept


def test_glancing_step_on_device_glances_at_the_best_alignment():
    """With glancing the random choices differ between devices, so check the rule: the glanced
    vertices get the reference token of the best path that the CPU computes from the CUDA
    pass-1 outputs, and the step's gradients are finite."""
    from fadat.objectives.glancing import glance

    model = tiny_model().to(DEVICE).train()
    batch = train_batch().to(DEVICE)
    glen = model.graph_lengths(batch.source_lengths)
    res = glance(
        model, model.encode(batch.source), batch.target, glen, batch.target_lengths, 0.5, 7
    )
    logits, links = res.pass1
    want = dag.best_alignment(
        torch.log_softmax(logits.float(), -1).cpu(),
        links.float().cpu(),
        batch.target.cpu(),
        glen.cpu(),
        batch.target_lengths.cpu(),
    )
    assert torch.equal(res.path.cpu(), want)
    oracle = batch.target.gather(1, res.path.clamp(min=0))
    assert torch.equal(res.decoder_tokens[res.glanced], oracle[res.glanced])
    assert int(res.glanced.sum()) > 0
    out = compute_loss(model, batch, ObjectiveConfig(name="nll", glancing_ratio=0.5))
    out.loss_sum.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def _losses(run: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (run / "train_log.jsonl").read_text().splitlines()]


def test_fadat_train_on_device_matches_the_cpu_run_and_its_model_loads_on_the_cpu(
    copy_data,  # noqa: F811  (the fixture imported from test_train)
    tmp_path,
):
    """Three updates of ``fadat train`` with and without ``--device cuda`` (dropout and glancing
    off, so both runs draw nothing random) and with each ``--dag-backend`` on the device: the
    same losses (update 1 to 1e-5 relative, the next ones 1e-3 after two Adam steps with
    accumulated rounding); then the CUDA run's
    checkpoint becomes a model directory that loads on the CPU and on CUDA with the same
    weights bit for bit. A bf16 and an fp16 run on the device give finite losses."""
    common = [
        "--data", str(copy_data), "--max-updates", "3", "--validate-every", "0", "--dropout",
        "0", "--glat-p", "0", "--no-progress-bar", "--threads", "1",
    ]  # fmt: skip
    assert main(["train", "--run-dir", str(tmp_path / "cpu"), *common]) == 0
    run = tmp_path / "dev"
    assert main(["train", "--run-dir", str(run), "--device", str(DEVICE), *common]) == 0
    cpu, dev = _losses(tmp_path / "cpu"), _losses(run)
    assert len(dev) == 3
    assert dev[0] == pytest.approx(cpu[0], rel=1e-5)
    assert dev == pytest.approx(cpu, rel=1e-3)
    # Each DAG backend forced on the device (the default run above used what "auto" picks):
    # the same losses to float32 rounding of the DP (1e-5), the same path after.
    on_gpu_with_triton = DEVICE.type == "cuda" and triton_dag.triton_importable()
    for backend in ("torch", "triton") if on_gpu_with_triton else ("torch",):
        forced = tmp_path / f"dev-{backend}"
        argv = ["--run-dir", str(forced), "--device", str(DEVICE), "--dag-backend", backend]
        assert main(["train", *argv, *common]) == 0
        assert _losses(forced)[0] == pytest.approx(dev[0], rel=1e-5)
        assert _losses(forced) == pytest.approx(dev, rel=1e-3)
    for flag in ("--bf16", "--fp16"):
        out = tmp_path / flag.strip("-")
        assert main(["train", "--run-dir", str(out), "--device", str(DEVICE), flag, *common]) == 0
        assert all(0 < x < 100 for x in _losses(out))

    model_dir = tmp_path / "model"
    ckpt = str(run / "checkpoint_last.pt")
    assert main(["average", "--checkpoints", ckpt, "--output", str(model_dir)]) == 0
    state = load_checkpoint(run / "checkpoint_last.pt")["model"]
    on_cpu = load_pretrained(model_dir, map_location="cpu")
    on_dev = load_pretrained(model_dir, map_location=DEVICE)
    for name, value in on_cpu.state_dict().items():
        assert value.device.type == "cpu"
        assert torch.equal(value, state[name].float()), name
        assert torch.equal(on_dev.state_dict()[name].cpu(), value), name


def test_model_saved_on_device_loads_on_cpu_and_back(tmp_path):
    model = tiny_model().to(DEVICE).eval()
    model.save_pretrained(tmp_path / "m")
    on_cpu = load_pretrained(tmp_path / "m", map_location="cpu")
    back = load_pretrained(tmp_path / "m", map_location=DEVICE)
    for name, value in model.state_dict().items():
        assert torch.equal(on_cpu.state_dict()[name], value.cpu()), name
        assert back.state_dict()[name].device.type == DEVICE.type
        assert torch.equal(back.state_dict()[name], value), name
    source = pad_sequences([[5, 6, 7, EOS_ID], [8, 9, EOS_ID]])
    with torch.inference_mode():
        want = on_cpu.graph_outputs(source)
        got = back.graph_outputs(source.to(DEVICE))
    for g, w in zip(got, want, strict=True):
        finite = torch.isfinite(w) if w.is_floating_point() else torch.ones_like(w, dtype=bool)
        torch.testing.assert_close(g.cpu()[finite], w[finite], rtol=0, atol=1e-5)


def test_cuda_rng_state_survives_a_checkpoint(tmp_path):
    """capture_rng_state holds the CUDA generators once CUDA is initialised; restoring it from
    a ``weights_only`` checkpoint read on the CPU replays the same CUDA draws."""
    if not ON_CUDA:
        pytest.skip("CUDA generators exist only on CUDA")
    torch.cuda.init()
    torch.manual_seed(11)
    state = capture_rng_state()
    assert "cuda" in state
    first = torch.rand(5, device=DEVICE)
    atomic_save({"format": CHECKPOINT_FORMAT, "rng": state}, tmp_path / "c.pt")
    torch.rand(7, device=DEVICE)  # move on
    restore_rng_state(load_checkpoint(tmp_path / "c.pt")["rng"])
    assert torch.equal(torch.rand(5, device=DEVICE), first)
