"""Measure, on this CPU, the differences that tests/test_legacy_models.py's tolerances cover.

The fixture's numbers were computed on another CPU; run this on a new kind of machine before
changing a tolerance, and quote what it prints beside the tolerance:

    .venv/bin/python tests/data/legacy/measure_differences.py

It prints, per fixture model, the largest absolute difference of the network outputs (finite
entries; tolerance ``OUTPUT_TOL``), the largest relative difference of hypothesis and sequence
scores (``SCORE_TOL``) and whether every token is equal; per fixture checkpoint, the largest
weight difference after the resumed update outside and inside the float32-noise elements
(``WEIGHT_ATOL``, ``NOISE_STEP_BOUND``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the tests directory

import test_legacy_models as T  # noqa: E402

from fadat.models.architectures import model_class  # noqa: E402
from fadat.models.config import ModelConfig  # noqa: E402
from fadat.models.directory import load_pretrained  # noqa: E402
from fadat.training.checkpoints import (  # noqa: E402
    capture_rng_state,
    load_checkpoint,
    restore_last,
    restore_rng_state,
)
from fadat.training.distributed import DistInfo  # noqa: E402


def _relative(got: float, want: float) -> float:
    return abs(got - want) / max(abs(want), 1e-30)


def outputs(name: str) -> tuple[float, float, bool]:
    """Largest absolute output difference, largest relative score difference, tokens equal."""
    model = load_pretrained(T.LEGACY / name)
    source, target, lengths = T.make_legacy.batch()
    expected = load_file(str(T.LEGACY / f"{name}.outputs.safetensors"))
    got = T.make_legacy.forward_outputs(model, source, target)
    largest = 0.0
    for key, want in expected.items():
        finite = torch.isfinite(want) & torch.isfinite(got[key])
        if finite.any():
            diff = (got[key][finite].double() - want[finite].double()).abs().max().item()
            largest = max(largest, diff)
    want_t = json.loads((T.LEGACY / f"{name}.translations.json").read_text(encoding="utf-8"))
    got_t = T._as_json(T.make_legacy.translations(model, source, target, lengths))
    score, tokens = 0.0, True
    for key, expected_t in want_t.items():
        if key == "score":  # [scores, lengths, extra]
            pairs = zip(
                torch.tensor(got_t[key][0]).flatten().tolist(),
                torch.tensor(expected_t[0]).flatten().tolist(),
                strict=True,
            )
            score = max([score, *(_relative(a, b) for a, b in pairs)])
            continue
        for sentence, wanted in zip(got_t[key], expected_t, strict=True):
            tokens &= [h[0] for h in sentence] == [h[0] for h in wanted]
            score = max(
                [score, *(_relative(a[1], b[1]) for a, b in zip(sentence, wanted, strict=False))]
            )
    return largest, score, tokens


def resumed_update(name: str) -> tuple[float, float]:
    """Largest weight difference after the resumed update: outside, inside the noise elements."""
    path = T.LEGACY / f"{name}.checkpoint_last.pt"
    state = load_checkpoint(path)
    config = ModelConfig.from_dict(dict(state["model_config"]))
    model = model_class(config.model_type)(config)
    optimizer = T.make_legacy.make_optimizer(model)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    rng = capture_rng_state()
    try:
        info = DistInfo(rank=0, world_size=1, device=torch.device("cpu"))
        restore_last(state, path, state["train_config"], set(), info, model, optimizer, scaler)
        first = {n: optimizer.state[p]["exp_avg"] / 0.1 for n, p in model.named_parameters()}
        source, target, _ = T.make_legacy.batch()
        T.make_legacy.train_step(model, optimizer, source, target)
    finally:
        restore_rng_state(rng)
    want = type(model).upgrade_state_dict(
        load_file(str(T.LEGACY / f"{name}.after_step2.safetensors"))
    )
    got = model.state_dict()
    second = {n: p.grad for n, p in model.named_parameters()}
    floor1 = T.GRAD_NOISE * max(g.abs().max() for g in first.values())
    floor2 = T.GRAD_NOISE * max(g.abs().max() for g in second.values())
    outside = inside = 0.0
    for key, tensor in want.items():
        diff = (got[key] - tensor).abs()
        noise = (first[key].abs() < floor1) & (second[key].abs() < floor2)
        if (~noise).any():
            outside = max(outside, diff[~noise].max().item())
        if noise.any():
            inside = max(inside, diff[noise].max().item())
    return outside, inside


def main() -> None:
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    worst_out = worst_score = 0.0
    for name in T.NAMES:
        out, score, tokens = outputs(name)
        worst_out, worst_score = max(worst_out, out), max(worst_score, score)
        print(f"{name:18s} outputs {out:.2e} abs, scores {score:.2e} rel, tokens equal {tokens}")
    print(f"largest: outputs {worst_out:.2e} (OUTPUT_TOL {T.OUTPUT_TOL}), scores {worst_score:.2e}")
    for name in T.make_legacy.CHECKPOINTS:
        outside, inside = resumed_update(name)
        print(
            f"{name:18s} resumed update: {outside:.2e} outside the noise elements "
            f"(WEIGHT_ATOL {T.WEIGHT_ATOL}), {inside:.2e} inside (bound {T.NOISE_STEP_BOUND})"
        )


if __name__ == "__main__":
    main()
