"""bench/bench_model.py's batch of ``--max-tokens`` and its rows (``--json``), on the CPU with
the tiny preset (its ``--device cuda`` path runs on the GPU machine: scripts/gpu/)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

from fadat.data.contract import graph_size

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_model", BENCH / "bench_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def padded_cost(batch, ratio: float, max_graph: int) -> int:
    """B · max over sentences of max(src, tgt, L), written out from the batching rule."""
    _, s_len, _, t_len = batch
    graph = graph_size(s_len, ratio, max_graph)
    return len(s_len) * int(torch.maximum(torch.maximum(s_len, t_len), graph).max())


def test_batch_for_tokens_is_the_largest_batch_within_the_budget():
    bench = load_bench()
    for max_tokens, ratio in ((8192, 8.0), (2048, 4.0), (100, 8.0)):
        batch, size, cost = bench.batch_for_tokens(100, max_tokens, 30, ratio, 1024)
        assert len(batch[0]) == size
        assert cost == padded_cost(batch, ratio, 1024)
        # brute force: the first size whose batch goes over the budget, minus one
        fits = [
            padded_cost(bench.make_batch(100, k, 30), ratio, 1024) <= max_tokens
            for k in range(1, 200)
        ]
        expected = max(1, fits.index(False)) if False in fits else 199
        assert size == expected, (max_tokens, ratio)
        assert cost <= max_tokens or size == 1
    # at λ = 8 the graph dominates: ≈ 8192 / (8 · 35) sentences of 25–35 tokens
    assert 25 <= bench.batch_for_tokens(100, 8192, 30, 8.0, 1024)[1] <= 40


def test_fp32_runs_do_not_time_the_bf16_matmul(monkeypatch, capsys):
    """The bf16 matmul peak is measured only when a bf16 variant runs (where bf16 is emulated,
    the default 2048³ bf16 matmul takes about a minute per repeat); with one it is measured."""
    bench = load_bench()
    dtypes = []
    real = bench.matmul_peak

    def recording(dtype, device, reps=5, n=0):
        dtypes.append(dtype)
        return real(dtype, device, reps=1, n=16)

    monkeypatch.setattr(bench, "matmul_peak", recording)
    argv = ["--preset", "tiny", "--vocab", "60", "--max-tokens", "300", "--ratios", "4"]
    argv += ["--steps", "1", "--threads", "1"]
    assert bench.main([*argv, "--variants", "fp32-eager"]) == 0
    assert dtypes and set(dtypes) == {torch.float32}
    assert "bf16 nan GFLOP/s" in capsys.readouterr().out
    dtypes.clear()
    assert bench.main([*argv, "--variants", "fp32-eager,bf16-eager"]) == 0
    assert dtypes.count(torch.bfloat16) == dtypes.count(torch.float32) > 0


def test_rows_add_up_and_whole_steps_train(tmp_path):
    bench = load_bench()
    out = tmp_path / "rows.json"
    variants = "fp32-eager,bf16-fused,bf16-glat,bf16-fuzzy"
    argv = ["--preset", "tiny", "--vocab", "60", "--max-tokens", "300", "--ratios", "4"]
    # --peak-size 64: the default 2048³ bf16 matmul takes minutes where bf16 is emulated (AVX2)
    argv += ["--steps", "2", "--threads", "1", "--peak-size", "64"]
    argv += ["--variants", variants, "--json", str(out)]
    assert bench.main(argv) == 0
    assert bench.main([*argv[:-4], "--variants", "bf16-fuzzy", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]  # the second run added to the first
    assert [[r["variant"] for r in run["rows"]] for run in runs] == [
        variants.split(","),
        ["bf16-fuzzy"],
    ]
    rows = runs[0]["rows"]
    assert [r["variant"] for r in rows] == variants.split(",")
    for r in rows:
        assert r["device"] == "CPU" and r["peak_mib"] is None and r["whole_step_ms"] == []
        assert abs(sum(r["stages_ms"].values()) - r["breakdown_best_ms"]) < 1e-6
        # on the CPU tokens/s come from the breakdown's best step
        assert abs(r["tokens_per_s"] * r["breakdown_best_ms"] / 1000 - r["target_tokens"]) < 1e-6
    assert set(rows[2]["stages_ms"]) == {"objective", "backward", "optimizer"}

    # A whole-step lap (the GPU's throughput timing) is one "step"; the step updates the model.
    torch.manual_seed(0)
    from fadat.models.config import make_config
    from fadat.models.dat import DATModel

    model = DATModel(make_config("tiny", 60)).train()
    before = [p.detach().clone() for p in model.parameters()]
    step = bench.ObjectiveStep(model, "fuzzy", 0.1, torch.device("cpu"))
    step.breakdown = False
    batch = bench.make_batch(60, 3, 12)
    assert set(step(*batch)) == {"step"}
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    # what stays between steps: fp32 weights and AdamW's two moments, plus its step counters
    params = list(model.parameters())
    weights = sum(p.numel() for p in params) * 4
    counters = sum(t.numel() * t.element_size() for s in step.opt.state.values()
                   for k, t in s.items() if k == "step")  # fmt: skip
    assert len(step.opt.state) == len(params)
    assert bench.resident_bytes(step) == 3 * weights + counters
