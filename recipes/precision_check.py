"""Valid loss of training checkpoints evaluated in fp32 and under bf16 autocast (RESULTS.md: bf16
against fp32).

Separates the two ways a bf16 run's logged valid loss can differ from an fp32 run's: the model
it trained (compare the fp32 evaluations) and the precision of the evaluation itself (compare
the two columns of one checkpoint). Uses ``fadat.training.validation.validate`` (the training
objective without glancing, eval mode) on the first ``--valid-subset`` valid sentences.

With ``--gradients CHECKPOINT``, it instead compares one update's gradients: the NLL of
``--batches`` training batches (40 sentences each, the same dropout masks, glancing off) is
back-propagated once in fp32 and once under bf16 autocast, and the relative error
``‖g_bf16 − g_fp32‖ / ‖g_fp32‖`` is printed per parameter group, largest first, next to the
same measure for fp32 with other dropout masks (the noise every update has anyway).

Usage::

    python recipes/precision_check.py runs/bf16-check/fp32-s1 runs/bf16-check/bf16-s1 ...
    python recipes/precision_check.py --gradients \
        runs/bf16-check/fp32-s1/checkpoint_best_u00000250.pt
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
from pathlib import Path

import torch

from fadat.data.binarized import BinarizedDataset
from fadat.models.architectures import model_class
from fadat.models.config import ModelConfig
from fadat.objectives import ObjectiveConfig, compute_loss
from fadat.training.checkpoints import load_checkpoint
from fadat.training.config import config_from_dict, load_yaml_config, objective_config
from fadat.training.validation import validate


def _group(name: str) -> str:
    """Parameter group of a parameter name: ``decoder.layers.0.fc1``,
    ``encoder.layers.2.self_attn``, ``links_head.key_linear``, ``decoder.embed_positions``."""
    parts = name.split(".")
    if "layers" in parts:
        i = parts.index("layers")
        return ".".join(parts[: i + 3])
    return ".".join(parts[:2])


def compare_gradients(checkpoint: Path, data: Path, batches: int) -> None:
    """Print per-group relative errors of bf16-autocast gradients against fp32 ones."""
    state = load_checkpoint(checkpoint)
    config = ModelConfig.from_dict(dict(state["model_config"]))
    model = model_class(config.model_type)(config)
    model.load_state_dict(state["model"])
    model.train()
    train = BinarizedDataset(data, "train")
    objective = ObjectiveConfig(name="nll", glancing_ratio=0.0)
    sums: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])

    def gradients(bf16: bool, batch, seed: int) -> tuple[float, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(seed)  # the same dropout masks in both precisions
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = compute_loss(model, batch, objective)
        loss = out.loss_sum / out.count
        loss.backward()
        grads = {
            n: q.grad.detach().clone() for n, q in model.named_parameters() if q.grad is not None
        }
        return float(loss.detach()), grads

    for k in range(batches):
        batch = train.collate(list(range(40 * k, 40 * k + 40)))
        loss32, g32 = gradients(False, batch, 100 + k)
        loss16, g16 = gradients(True, batch, 100 + k)
        _, g_other = gradients(False, batch, 200 + k)  # fp32, other dropout masks
        print(f"batch {k}: loss fp32 {loss32:.5f}, bf16 {loss16:.5f}")
        for name, g in g32.items():
            sums[_group(name)][0] += float((g16[name] - g).pow(2).sum())
            sums[_group(name)][1] += float(g.pow(2).sum())
            sums[_group(name)][2] += float((g_other[name] - g).pow(2).sum())
    print("| parameter group | bf16 vs fp32 | fp32, other dropout masks | ‖g‖ fp32 |")
    print("|---|---|---|---|")
    for name, (diff, norm, other) in sorted(
        sums.items(), key=lambda kv: -kv[1][0] / max(kv[1][1], 1e-30)
    ):
        rel, rel_other = (diff / max(norm, 1e-30)) ** 0.5, (other / max(norm, 1e-30)) ** 0.5
        print(f"| {name} | {rel:.4f} | {rel_other:.3f} | {norm**0.5:.3e} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="*", help="run directories (their checkpoint_last.pt)")
    p.add_argument("--valid-subset", type=int, default=300)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--gradients", metavar="CHECKPOINT", help="compare one update's gradients")
    p.add_argument("--data", default="data/bible-en-es", help="dataset for --gradients")
    p.add_argument("--batches", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.gradients:
        compare_gradients(Path(args.gradients), Path(args.data), args.batches)
        return
    if not args.runs:
        p.error("give run directories, or --gradients CHECKPOINT")
    device = torch.device("cpu")
    print("| run | trained in | update | valid loss (fp32 eval) | valid loss (bf16 eval) | BLEU |")
    print("|---|---|---|---|---|---|")
    for run in args.runs:
        run = Path(run)
        cfg = config_from_dict(load_yaml_config(run / "config.yaml"), str(run / "config.yaml"))
        cfg = dataclasses.replace(cfg, valid_subset=args.valid_subset)
        state = load_checkpoint(run / "checkpoint_last.pt")
        config = ModelConfig.from_dict(dict(state["model_config"]))
        model = model_class(config.model_type)(config)
        model.load_state_dict(state["model"])
        valid = BinarizedDataset(cfg.data, "valid")
        objective = objective_config(cfg, glancing_ratio=0.0)
        results = {}
        for name, enabled in (("fp32", False), ("bf16", True)):  # BLEU below: the fp32 one
            autocast = dict(device_type="cpu", dtype=torch.bfloat16, enabled=enabled)
            results[name] = validate(model, valid, cfg, device, objective, autocast)
        print(
            f"| {run.name} | {'bf16' if cfg.bf16 else 'fp32'} | {state['progress']['update']} | "
            f"{results['fp32']['valid_loss']:.5f} | {results['bf16']['valid_loss']:.5f} | "
            f"{results['fp32']['bleu']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
