"""Training-step benchmark of the DA-Transformer network on the CPU or one CUDA GPU.

For a preset (default ``cpu-small``) at a typical batch (B sentences, source ≈ S tokens, target
≈ source length) and each graph-size ratio λ, times one NLL training step broken down into
encoder, decoder, token head + log-softmax, links head, objective
(``fadat.dag.dag_log_likelihood``), backward and optimizer (fused AdamW), for several variants:

- ``fp32-eager``: the plain reference step (torch's ``F.dropout``);
- ``bf16-eager``: ``torch.autocast("cpu", bfloat16)`` (links, log-softmax and DAG stay fp32);
- ``bf16-fused``: ``bf16-eager`` with the training path of ``fadat.objectives``: the token head
  stops at the logits and the objective takes the reference tokens' log-probabilities through
  ``fadat.objectives.losses.target_logprobs`` (row-blocked fp32 log-softmax, hand-written backward;
  no ``(B, L, V)`` fp32 log-softmax; its backward writes the logits' gradient into their own
  storage), so the log-softmax is timed under "objective"; and the cheaper dropout masks of
  ``fadat.models.transformer.dropout`` (``ModelConfig.fast_dropout``), as ``fadat train`` uses;
- ``fp32-compile`` / ``bf16-compile``: the same with the encoder, each decoder layer and the links
  head compiled in place (``nn.Module.compile``, dynamic shapes); the compile time is measured and
  reported; a variant whose compilation fails falls back to eager and says so;
- ``bf16-glat`` / ``bf16-fuzzy``: whole training steps of ``fadat train`` through
  ``fadat.objectives.compute_loss`` under bf16 autocast: NLL with glancing ratio 0.5 (the paper's
  pre-training start; the glancing pass is a no-grad forward and a best alignment before the
  training forward) and the fuzzy alignment loss (n = 2, glancing 0.1, the fine-tuning
  setting); their stages are "objective" (the forward, glancing and loss), "backward" and
  "optimizer". Against ``bf16-fused`` they show what glancing and the fuzzy loss add.

``--components``: besides the steps, the pieces of a step that the stages above lump together,
each timed alone on this batch (median of ``--steps`` calls after one warm-up; on a GPU each after a
``torch.cuda.synchronize``), the DAG programmes in fp32 as the objectives run them, the network
under bf16 autocast: the DAG NLL forward and backward (``dag_log_likelihood_from_match`` from the
step's ``match`` and links), the glancing pass (``fadat.objectives.glancing.glance`` at ratio 0.5:
a no-grad decoder pass, the reference tokens' log-probabilities and the best alignment), the best
alignment alone, and the fuzzy alignment loss (n = 2) forward and backward from the
``(B, L, V)`` log-softmax. The line ``DAG share`` gives the DAG NLL's forward + backward over the
fastest ``bf16-fused`` step (the training path), where that variant ran.

It reports target tokens/s, matmul GFLOP/s achieved (FLOPs of mm/bmm/attention counted by
``torch.utils.flop_counter`` on the fp32 step) next to the measured peak of a large fp32 and
(where a bf16 variant runs) bf16 matmul in the same run, the speed-up over ``fp32-eager``, and
whether a second pass under the same seed reproduces the first bitwise (the glancing
requirement) in each variant. Where bf16 is emulated (a CPU without AVX-512 BF16 or AMX) it
says so: the bf16 variants then time the emulation, which ``fadat train`` avoids by training in
fp32.

Usage::

    python bench/bench_model.py [--preset cpu-small] [--vocab 8000] [--batch 32] [--src-len 30]
                                [--ratios 4 8] [--steps 3] [--variants fp32-eager,bf16-eager,...]
                                [--device cpu|cuda] [--max-tokens N] [--json FILE]
                                [--dag-backend auto|torch|triton] [--components]

``--max-tokens N`` replaces ``--batch``: the batch is as many sentences as ``fadat train
--max-tokens N`` puts in one micro-batch at this length, i.e. B · max cost ≤ N with a sentence's
cost ``max(src, tgt, L)`` (``fadat.data.batching.sentence_costs``; at λ = 8 the graph size L
dominates, so ``--max-tokens 8192`` holds ≈ 8192 / (8 · 35) ≈ 29 sentences of ≈ 30 tokens).

``--device cuda``: the model and batch on the GPU, the stage laps taken after
``torch.cuda.synchronize`` (which serialises the host and the GPU at every lap: the breakdown's
total is a little slower than a real step), tokens/s from ``--steps`` further steps timed whole
(wall clock between two synchronizes), and the peak memory of the variant's steps: its model's
parameters and optimizer state plus the rise of ``torch.cuda.max_memory_allocated`` during its
step above what was allocated before it (gradients, activations; the other variants' models,
also on the GPU, do not count). The matmul peak is then an 8192³ GPU matmul. The DAG
programmes run where ``--dag-backend`` sends them, as ``fadat train --dag-backend``: ``auto`` (the
default) is what training uses, the Triton kernels on float32 CUDA tensors where ``triton`` is
installed (``fadat.kernels.triton_dag.AUTO_USES_TRITON``), else the PyTorch DPs; ``torch`` forces
the PyTorch DPs (the comparison), ``triton`` the kernels (an error without CUDA and triton). A
row's ``dag_triton`` says which ran.

The machine may be shared with other jobs, which slows single steps by up to several times: the
variants are timed interleaved (one step of each in turn), the table shows the *fastest* of
``--steps`` steps (the least disturbed one; its stage breakdown, tokens/s, GFLOP/s) next to the
median step, and the peak matmul (best of 5) is measured in the same run at the start and the end.
``--json FILE`` adds this run to FILE (``{"runs": [{"argv", "params", "rows"}, ...]}``, earlier runs
kept, so that several runs share one file; a row per ratio and variant: milliseconds, tokens/s,
MiB).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

# The memory settings the `fadat` command makes (fadat.process.tune_memory: huge pages for torch's
# large allocations, THP_MEM_ALLOC_ENABLE=0 to compare; glibc keeping freed blocks); torch reads
# the huge-page setting once, so it must precede the torch import.
from fadat.process import native_bf16, tune_memory  # noqa: E402

tune_memory()

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from fadat.data.batching import sentence_costs  # noqa: E402
from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID, Batch, graph_size  # noqa: E402
from fadat.models.config import make_config  # noqa: E402
from fadat.models.dat import DATModel  # noqa: E402

STAGES = ("encoder", "decoder", "token_head", "links_head", "objective", "backward", "optimizer")
VARIANTS = (
    "fp32-eager",
    "bf16-eager",
    "bf16-fused",
    "fp32-compile",
    "bf16-compile",
    "bf16-glat",
    "bf16-fuzzy",
)
#: the whole-step variants: (objective, glancing ratio) of fadat.objectives.compute_loss
OBJECTIVE_VARIANTS = {"bf16-glat": ("nll", 0.5), "bf16-fuzzy": ("fuzzy", 0.1)}


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously; the CPU does not)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def objective_fn() -> tuple[Callable, str]:
    """The DAG NLL used as the objective: fadat.dag's, else a plain log-space forward loop."""
    try:
        from fadat.dag import dag_log_likelihood

        return dag_log_likelihood, "fadat.dag.dag_log_likelihood"
    except ImportError:

        def plain(token_logprobs, links, targets, graph_lengths, target_lengths):
            match = token_logprobs.gather(
                -1, targets[:, None, :].expand(-1, token_logprobs.shape[1], -1)
            ).transpose(1, 2)  # (B, T, L)
            f = match[:, 0].clone()
            f[:, 1:] = float("-inf")
            out = []
            for t in range(1, targets.shape[1]):
                f = torch.logsumexp(f[:, :, None] + links, dim=1) + match[:, t]  # (B, L)
                out.append(f)
            alpha = torch.stack([match[:, 0], *out], dim=1)  # (B, T, L)
            idx = torch.arange(len(targets))
            return alpha[idx, target_lengths - 1, graph_lengths - 1]

        return plain, "plain log-space forward loop in this bench (fadat.dag not found)"


def matmul_peak(dtype: torch.dtype, device: torch.device, reps: int = 5, n: int = 0) -> float:
    """GFLOP/s of an n×n×n matmul (best of ``reps``; n = 0: 2048 on the CPU, 8192 on a GPU)."""
    n = n or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        synchronize(device)
        t = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def make_batch(vocab: int, batch: int, src_len: int, seed: int = 0):
    """Random ``x </s>`` sources of length src_len ± 5 and ``<s> y </s>`` targets of about the
    same length (ids ≥ 4)."""
    g = torch.Generator().manual_seed(seed)
    s_len = torch.randint(src_len - 5, src_len + 6, (batch,), generator=g)
    t_len = torch.randint(src_len - 5, src_len + 6, (batch,), generator=g)
    source = torch.full((batch, int(s_len.max())), PAD_ID)
    target = torch.full((batch, int(t_len.max())), PAD_ID)
    for b in range(batch):
        n, m = int(s_len[b]), int(t_len[b])
        source[b, : n - 1] = torch.randint(4, vocab, (n - 1,), generator=g)
        source[b, n - 1] = EOS_ID
        target[b, 0] = BOS_ID
        target[b, 1 : m - 1] = torch.randint(4, vocab, (m - 2,), generator=g)
        target[b, m - 1] = EOS_ID
    return source, s_len, target, t_len


def batch_for_tokens(vocab: int, max_tokens: int, src_len: int, ratio: float, max_graph: int):
    """The batch ``fadat train --max-tokens max_tokens`` would form of sentences like
    :func:`make_batch`'s: the largest B whose padded cost B · max cost ≤ ``max_tokens``
    (:func:`fadat.data.batching.sentence_costs`), at least 1. Returns ``(batch, B, cost)``."""
    size = 1
    while True:
        batch = make_batch(vocab, size + 1, src_len)
        costs = sentence_costs(batch[1].numpy(), batch[3].numpy(), ratio, max_graph)
        if (size + 1) * int(costs.max()) > max_tokens:
            break
        size += 1
    while True:  # each size draws its own lengths: check the one returned
        batch = make_batch(vocab, size, src_len)
        costs = sentence_costs(batch[1].numpy(), batch[3].numpy(), ratio, max_graph)
        cost = size * int(costs.max())
        if cost <= max_tokens or size == 1:
            return batch, size, cost
        size -= 1


class Step:
    """One training step with per-stage wall-clock timing; on a GPU each lap first waits for
    the queued work (``breakdown=False``: one lap, ``"step"``, for the whole step)."""

    def __init__(
        self,
        model: DATModel,
        bf16: bool,
        objective: Callable,
        fused: bool = False,
        device: torch.device | None = None,
    ) -> None:
        self.model = model
        self.bf16 = bf16
        self.objective = objective
        self.fused = fused
        self.device = device or torch.device("cpu")
        self.breakdown = True
        # fused AdamW (one kernel for all parameters) where this torch supports it on the device
        try:
            self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
        except (RuntimeError, TypeError):
            self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

    def autocast(self):
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def timer(self) -> Callable[[str], None]:
        """``lap(name)`` records the time since the previous lap into ``self.times``."""
        self.times: dict[str, float] = {}
        synchronize(self.device)
        t = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal t
            if not self.breakdown and name != "optimizer":
                return
            synchronize(self.device)
            now = time.perf_counter()
            self.times["step" if not self.breakdown else name] = now - t
            t = now

        return lap

    def forward(self, source, s_len):
        m = self.model
        gl = m.graph_lengths(s_len)
        toks = m.decoder_input_tokens(gl)
        with self.autocast():
            enc = m.encode(source)
            states = m.decoder_states(enc, toks)
            return m.token_head(states), m.links_head(states, gl)

    def __call__(self, source, s_len, target, t_len) -> dict[str, float]:
        m = self.model
        lap = self.timer()
        gl = m.graph_lengths(s_len)
        toks = m.decoder_input_tokens(gl)
        with self.autocast():
            enc = m.encode(source)
            lap("encoder")
            states = m.decoder_states(enc, toks)
            lap("decoder")
            lp = m.token_logits(states) if self.fused else m.token_head(states)
            lap("token_head")
            links = m.links_head(states, gl)
            lap("links_head")
        if self.fused:
            from fadat.dag import dag_log_likelihood_from_match
            from fadat.objectives.losses import target_logprobs

            match = target_logprobs(lp, target, inplace_backward=True)  # (B, T, L) fp32
            ll = dag_log_likelihood_from_match(match, links, gl, t_len)
        else:
            ll = self.objective(lp, links, target, gl, t_len)
        loss = -(ll / t_len).mean()
        return self.finish(loss, lap)

    def finish(self, loss: torch.Tensor, lap: Callable[[str], None]) -> dict[str, float]:
        """The step's end, shared by every variant: backward and the optimizer update, each
        lapped after the forward's "objective" lap; returns the stage times."""
        lap("objective")
        loss.backward()
        lap("backward")
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        lap("optimizer")
        return self.times


class ObjectiveStep(Step):
    """A whole ``fadat train`` step through :func:`fadat.objectives.compute_loss` (glancing and
    the objective included) under bf16 autocast; stages "objective", "backward", "optimizer"."""

    def __init__(self, model: DATModel, name: str, glancing: float, device: torch.device):
        super().__init__(model, True, None, device=device)
        from fadat.objectives import ObjectiveConfig

        self.cfg = ObjectiveConfig(name=name, glancing_ratio=glancing)

    def __call__(self, source, s_len, target, t_len) -> dict[str, float]:
        from fadat.objectives import compute_loss

        lap = self.timer()
        ids = torch.arange(len(source), device=source.device)
        batch = Batch(source, target, s_len, t_len, ids)
        with self.autocast():
            out = compute_loss(self.model, batch, self.cfg)
        return self.finish(out.loss_sum / out.count, lap)


def compile_in_place(model: DATModel) -> None:
    """Compile the encoder, each decoder layer and the links head (state_dict keys unchanged)."""
    model.encoder.compile(dynamic=True)
    for layer in model.decoder.layers:
        layer.compile(dynamic=True)
    model.links_head.compile(dynamic=True)


def resident_bytes(step: Step) -> int:
    """Bytes of the step's model parameters and optimizer state (what stays between steps)."""
    tensors = list(step.model.parameters())
    for state in step.opt.state.values():
        tensors += [t for t in state.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors)


def make_step(name: str, model: DATModel, objective: Callable, device: torch.device) -> Step:
    if name in OBJECTIVE_VARIANTS:
        return ObjectiveStep(model, *OBJECTIVE_VARIANTS[name], device=device)
    return Step(model, name.startswith("bf16"), objective, fused="fused" in name, device=device)


def prepare_variant(name: str, args, ratio: float, objective: Callable, batch) -> dict:
    """Build the model of one variant and warm it up (compilation included in the warm-up)."""
    torch.manual_seed(0)
    # The fused and whole-step variants are the `fadat train` path, cheaper dropout masks
    # included.
    fast = "fused" in name or name in OBJECTIVE_VARIANTS
    config = make_config(args.preset, args.vocab, upsample_ratio=ratio, fast_dropout=fast)
    model = DATModel(config).to(args.device).train()
    note = ""
    compiled = name.endswith("compile")
    if compiled:
        compile_in_place(model)
    step = make_step(name, model, objective, args.device)
    source, s_len, target, t_len = batch
    t0 = time.perf_counter()
    try:
        step(source, s_len, target, t_len)
        # a second shape, as in training, so dynamic-shape compilation is part of the warm-up
        step(source[:-1], s_len[:-1], target[:-1], t_len[:-1])
    except Exception as err:  # eager fallback: report it, keep the table
        note = f"compile failed ({type(err).__name__}: {str(err)[:60]}); eager fallback"
        compiled = False
        torch.manual_seed(0)
        model = DATModel(config).to(args.device).train()
        step = make_step(name, model, objective, args.device)
        step(source, s_len, target, t_len)
    warm_s = time.perf_counter() - t0
    # same-seed determinism of the decoder pass (dropout masks), as glancing needs
    with torch.no_grad():
        torch.manual_seed(7)
        a = step.forward(source, s_len)
        torch.manual_seed(7)
        b = step.forward(source, s_len)
    same = all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    return {
        "variant": name,
        "step": step,
        "runs": [],
        "compile_s": warm_s if compiled else 0.0,
        "same_seed_equal": same,
        "note": note,
    }


def count_flops(args, ratio, objective, batch) -> float:
    torch.manual_seed(0)
    model = DATModel(make_config(args.preset, args.vocab, upsample_ratio=ratio))
    model = model.to(args.device).train()
    step = Step(model, False, objective, device=args.device)
    source, s_len, target, t_len = batch
    with FlopCounterMode(display=False) as counter:
        step(source, s_len, target, t_len)
    return float(counter.get_total_flops())


def time_components(args, ratio: float, batch, reps: int) -> dict[str, float]:
    """Median milliseconds of the step's pieces timed alone (``--components``; the module
    docstring): ``encoder``, ``decoder`` (forwards), ``token_head_log_softmax`` (the output
    projection and the (B, L, V) fp32 log-softmax), ``links_head``, ``dag_nll_forward`` /
    ``dag_nll_backward``, ``glancing_pass``, ``best_alignment``, ``fuzzy_forward`` /
    ``fuzzy_backward``."""
    from fadat.dag import best_alignment_from_match, dag_log_likelihood_from_match
    from fadat.objectives.glancing import glance
    from fadat.objectives.losses import fuzzy_loss, target_logprobs

    device = args.device
    torch.manual_seed(0)
    config = make_config(args.preset, args.vocab, upsample_ratio=ratio, fast_dropout=True)
    model = DATModel(config).to(device).train()
    source, s_len, target, t_len = batch
    gl = model.graph_lengths(s_len)  # (B,)
    toks = model.decoder_input_tokens(gl)  # (B, L)
    bf16 = torch.autocast(device.type, dtype=torch.bfloat16)
    times: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable[[], object]):
        synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        synchronize(device)
        times.setdefault(name, []).append(1000 * (time.perf_counter() - t0))
        return out

    def one_round() -> None:
        with torch.no_grad(), bf16:
            enc = timed("encoder", lambda: model.encode(source))
            states = timed("decoder", lambda: model.decoder_states(enc, toks))  # (B, L, d)
            logits = model.token_logits(states)  # (B, L, V) bf16

            def token_head():  # the (B, L, V) fp32 log-probabilities that fuzzy_loss reads
                return torch.log_softmax(model.token_logits(states).float(), -1)

            logprobs = timed("token_head_log_softmax", token_head)
            links = timed("links_head", lambda: model.links_head(states, gl)).float()  # (B, L, L)
            match = target_logprobs(logits, target)  # (B, T, L) fp32
        leaf, links_leaf = match.requires_grad_(), links.clone().requires_grad_()
        ll = timed(
            "dag_nll_forward", lambda: dag_log_likelihood_from_match(leaf, links_leaf, gl, t_len)
        )
        timed("dag_nll_backward", lambda: (-(ll / t_len).mean()).backward())
        with torch.no_grad():
            timed("best_alignment", lambda: best_alignment_from_match(match, links, gl, t_len))
            with bf16:
                timed("glancing_pass", lambda: glance(model, enc, target, gl, t_len, 0.5, seed=7))
        lp, links_leaf = logprobs.requires_grad_(), links.clone().requires_grad_()
        out = timed("fuzzy_forward", lambda: fuzzy_loss(lp, links_leaf, target, gl, t_len, order=2))
        timed("fuzzy_backward", lambda: (out.loss_sum / out.count).backward())

    for _ in range(reps + 1):  # the first round warms up and is dropped below
        one_round()
    return {k: statistics.median(v[1:]) if len(v) > 1 else v[0] for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="cpu-small")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=0, help="batch as fadat train's (0 = --batch)")
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--ratios", type=float, nargs="+", default=[4.0, 8.0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS[:5]))
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--json", default=None, help="add this run's rows to this JSON file")
    p.add_argument(
        "--dag-backend",
        choices=("auto", "torch", "triton"),
        default="auto",
        help="where the DAG programmes run (as fadat train --dag-backend; docstring)",
    )
    p.add_argument(
        "--peak-size",
        type=int,
        default=0,
        help="n of the n³ matmul that measures the peak (0: 2048 on the CPU, 8192 on a GPU; "
        "a CPU without bf16 instructions takes minutes at 2048)",
    )
    p.add_argument(
        "--components", action="store_true", help="also time the step's pieces alone (docstring)"
    )
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}")
    args.device = torch.device(args.device)
    if args.device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch.cuda.is_available() is False")
    on_gpu = args.device.type == "cuda"
    from fadat.kernels import triton_dag

    # the objective calls the DAG with backend="auto": AUTO_USES_TRITON carries the choice
    can_triton = on_gpu and triton_dag.triton_importable()
    if args.dag_backend == "triton" and not can_triton:
        p.error("--dag-backend triton needs --device cuda and the triton package")
    wanted = {"auto": triton_dag.AUTO_USES_TRITON, "torch": False, "triton": True}
    triton_dag.AUTO_USES_TRITON = wanted[args.dag_backend]
    args.dag_triton = can_triton and triton_dag.AUTO_USES_TRITON
    torch.set_num_threads(args.threads)
    objective, objective_name = objective_fn()

    # the bf16 peak only where a bf16 variant needs it: where bf16 is emulated (a CPU without
    # AVX-512 BF16 or AMX) the default 2048³ bf16 matmul runs at well under 1 GFLOP/s, about a
    # minute per repeat on an AVX2 Zen 3
    wants_bf16 = any(v.startswith("bf16") for v in variants)

    def bf16_peak() -> float:
        if not wants_bf16:
            return float("nan")
        return matmul_peak(torch.bfloat16, args.device, n=args.peak_size)

    peak32 = matmul_peak(torch.float32, args.device, n=args.peak_size)
    peak16 = bf16_peak()
    config = make_config(args.preset, args.vocab)
    n_params = sum(p.numel() for p in DATModel(config).parameters())
    where = torch.cuda.get_device_name(args.device) if on_gpu else "CPU"
    print(
        f"torch {torch.__version__}, {where}, {torch.get_num_threads()} threads, "
        f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE')}"
    )
    print(
        f"preset {args.preset}: d={config.d_model} layers={config.encoder_layers}+"
        f"{config.decoder_layers} heads={config.attention_heads} ffn={config.ffn_dim} "
        f"V={args.vocab} params={n_params / 1e6:.2f}M"
    )
    print(
        f"objective: {objective_name}; DAG backend {args.dag_backend} -> Triton: {args.dag_triton}"
    )
    print(f"load average at the start: {os.getloadavg()[0]:.1f}")
    n = args.peak_size or (8192 if on_gpu else 2048)
    print(f"matmul peak ({n}³): fp32 {peak32:.1f} GFLOP/s, bf16 {peak16:.1f} GFLOP/s")
    if wants_bf16 and not native_bf16(args.device.type):
        print(
            "note: bf16 is emulated on this device (no AVX-512 BF16 or AMX): the bf16 variants "
            "time that emulation, and `fadat train --bf16` would train in fp32 here"
        )
    rows = []
    prior = []  # the runs already in --json
    if args.json and os.path.exists(args.json):
        with open(args.json, encoding="utf-8") as f:
            prior = json.load(f)["runs"]
    run = {"argv": sys.argv[1:] if argv is None else list(argv), "params": n_params, "rows": rows}
    for ratio in args.ratios:
        if args.max_tokens:
            batch, size, cost = batch_for_tokens(
                args.vocab, args.max_tokens, args.src_len, ratio, config.max_target_positions
            )
            budget = f"--max-tokens {args.max_tokens}: B={size}, padded cost {cost}"
        else:
            batch, size = make_batch(args.vocab, args.batch, args.src_len), args.batch
            budget = f"B={size}"
        batch = tuple(t.to(args.device) for t in batch)
        source, s_len, target, t_len = batch
        gl = graph_size(s_len.cpu(), ratio, config.max_target_positions)
        flops = count_flops(args, ratio, objective, batch)
        print()
        print(
            f"λ={ratio:g}: {budget}, source tokens {int(s_len.sum())} "
            f"(mean {s_len.double().mean():.1f}), target tokens {int(t_len.sum())}, "
            f"graph L max {int(gl.max())} (vertices {int(gl.sum())}), "
            f"matmul/attention FLOPs per step {flops / 1e9:.1f} G"
        )
        prepared = [prepare_variant(v, args, ratio, objective, batch) for v in variants]
        # Interleave the variants step by step, so that load from other jobs on a shared machine
        # hits all of them alike.
        for _ in range(args.steps):
            for v in prepared:
                if on_gpu:
                    # Every variant's model and optimizer stay on the GPU: a variant's peak is
                    # its own weights and optimizer state plus what its step allocates on top.
                    synchronize(args.device)
                    before = torch.cuda.memory_allocated(args.device)
                    torch.cuda.reset_peak_memory_stats(args.device)
                v["runs"].append(v["step"](source, s_len, target, t_len))
                if on_gpu:
                    extra = torch.cuda.max_memory_allocated(args.device) - before
                    mib = (resident_bytes(v["step"]) + extra) / 2**20
                    v["peak_mib"] = max(v.get("peak_mib", 0.0), mib)
        if on_gpu:
            # Whole steps with one synchronize each: the breakdown's laps serialise host and GPU.
            for v in prepared:
                v["step"].breakdown = False
            for _ in range(args.steps):
                for v in prepared:
                    times = v["step"](source, s_len, target, t_len)
                    v.setdefault("whole", []).append(times["step"])
        # the least disturbed peak so far (the start-of-run figure may itself be slowed down)
        peak32 = max(peak32, matmul_peak(torch.float32, args.device, n=args.peak_size))
        peak16 = max(peak16, bf16_peak())
        print(f"peak so far: fp32 {peak32:.1f} GFLOP/s, bf16 {peak16:.1f} GFLOP/s (for %peak)")
        header = (
            f"{'variant':<13}"
            + "".join(f"{s:>11}" for s in STAGES)
            + f"{'best ms':>9}{'median':>8}{'tok/s':>8}{'GFLOP/s':>9}{'%peak':>6}{'speedup':>8}"
            f"{'compile s':>10}{'peak MiB':>9}  same-seed"
        )
        print(header)
        tokens = int(t_len.sum())
        base = None
        for v in prepared:
            best = min(v["runs"], key=lambda r: sum(r.values()))
            total = sum(best.values())
            median = statistics.median(sum(r.values()) for r in v["runs"])
            # tokens/s from whole steps where they were timed (GPU), else from the breakdown
            step_s = min(v["whole"]) if "whole" in v else total
            tok_s = tokens / step_s
            gflops = flops / step_s / 1e9
            if v["variant"] == "fp32-eager":
                base = tok_s
            peak = peak16 if v["variant"].startswith("bf16") else peak32
            speed = f"{tok_s / base:.2f}x" if base else "-"
            mib = v.get("peak_mib", float("nan"))
            print(
                f"{v['variant']:<13}"
                + "".join(
                    f"{1000 * best[s]:>9.0f}ms" if s in best else f"{'-':>11}" for s in STAGES
                )
                + f"{1000 * total:>9.0f}{1000 * median:>8.0f}{tok_s:>8.0f}{gflops:>9.1f}"
                f"{100 * gflops / peak:>5.0f}%{speed:>8}{v['compile_s']:>10.1f}{mib:>9.0f}"
                f"  {'yes' if v['same_seed_equal'] else 'NO'} {v['note']}"
            )
            rows.append(
                {
                    "preset": args.preset,
                    "device": where,
                    "ratio": ratio,
                    "variant": v["variant"],
                    "dag_backend": args.dag_backend,
                    "dag_triton": args.dag_triton,
                    "batch_sentences": size,
                    "max_tokens": args.max_tokens or None,
                    "target_tokens": tokens,
                    "stages_ms": {k: 1000 * x for k, x in best.items()},
                    "breakdown_best_ms": 1000 * total,
                    "breakdown_median_ms": 1000 * median,
                    "whole_step_ms": [1000 * x for x in v.get("whole", [])],
                    "tokens_per_s": tok_s,
                    "gflops": gflops,
                    "peak_mib": None if "peak_mib" not in v else mib,
                    "compile_s": v["compile_s"],
                    "same_seed_equal": v["same_seed_equal"],
                    "note": v["note"],
                }
            )
        if args.components:
            parts = time_components(args, ratio, batch, max(1, args.steps))
            print(
                "pieces timed alone (median ms): "
                + ", ".join(f"{k} {x:.2f}" for k, x in parts.items())
            )
            fused = [r for r in rows if r["ratio"] == ratio and r["variant"] == "bf16-fused"]
            share = None
            if fused:  # the step time behind its tokens/s: whole steps on a GPU
                step_ms = min(fused[0]["whole_step_ms"] or [fused[0]["breakdown_best_ms"]])
                share = (parts["dag_nll_forward"] + parts["dag_nll_backward"]) / step_ms
                print(f"DAG share: NLL forward + backward {100 * share:.1f} % of a bf16-fused step")
            run.setdefault("components", []).append(
                {"ratio": ratio, "ms": parts, "dag_nll_share_of_fused_step": share}
            )
        sys.stdout.flush()
        if args.json:
            # after every ratio, so that a run stopped later keeps what it measured
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"runs": [*prior, run]}, f, indent=1)
    end32 = matmul_peak(torch.float32, args.device, n=args.peak_size)
    end16 = bf16_peak()
    print(f"\nmatmul peak again at the end: fp32 {end32:.1f}, bf16 {end16:.1f} GFLOP/s")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (2 cores: > 2 means other jobs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
