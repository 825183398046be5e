"""Valid loss of training checkpoints evaluated in fp32 and under bf16 autocast (issue 4).

Separates the two ways a bf16 run's logged valid loss can differ from an fp32 run's: the model
it trained (compare the fp32 evaluations) and the precision of the evaluation itself (compare
the two columns of one checkpoint). Uses ``fadat.train.validate`` (the training objective
without glancing, eval mode) on the first ``--valid-subset`` valid sentences.

Usage::

    python recipes/precision_check.py runs/bf16-check/fp32-s1 runs/bf16-check/bf16-s1 ...
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from fadat.data.binarized import BinarizedDataset
from fadat.model import ModelConfig
from fadat.objectives import ObjectiveConfig
from fadat.train import _model_class, config_from_dict, load_checkpoint, load_yaml_config, validate


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="run directories (their checkpoint_last.pt)")
    p.add_argument("--valid-subset", type=int, default=300)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    print("| run | trained in | update | valid loss (fp32 eval) | valid loss (bf16 eval) | BLEU |")
    print("|---|---|---|---|---|---|")
    for run in args.runs:
        run = Path(run)
        cfg = config_from_dict(load_yaml_config(run / "config.yaml"), str(run / "config.yaml"))
        cfg = dataclasses.replace(cfg, valid_subset=args.valid_subset)
        state = load_checkpoint(run / "checkpoint_last.pt")
        config = ModelConfig.from_dict(dict(state["model_config"]))
        model = _model_class(config.model_type)(config)
        model.load_state_dict(state["model"])
        valid = BinarizedDataset(cfg.data, "valid")
        objective = ObjectiveConfig(
            name=cfg.objective or "nll",
            glancing_ratio=0.0,
            force_emit=cfg.force_emit,
            ngram_order=cfg.ngram_order,
            label_smoothing=cfg.label_smoothing,
        )
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
