"""Write the legacy fixture of tests/test_legacy_models.py: tiny models of every architecture
saved by an earlier version of fadat, and their outputs.

Run with the code whose format the fixture records (it was written by main at 890da67, before the
decoder stack was shared and the DAT's and AT's decoder parameters moved under ``decoder.``)::

    git archive 890da67 fadat | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old python tests/data/legacy/make_legacy_models.py tests/data/legacy

Per model NAME: ``NAME/`` (a model directory of ``save_pretrained``), ``NAME.outputs.safetensors``
(fp32 forward outputs in eval mode and, for DAT and AT, in train mode under a fixed seed) and
``NAME.translations.json`` (``translate_batch`` of every strategy and ``score_batch``) and
``NAME.parameters.json`` (the names of ``named_parameters()`` in order: an optimizer state
refers to parameters by that position). For :data:`CHECKPOINTS` (the architectures of the long
runs, DAT and AT) also ``NAME.checkpoint_last.pt`` (a checkpoint_last after one AdamW update,
:func:`train_step`) and ``NAME.after_step2.safetensors`` (the weights after a second update).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from fadat.data.contract import BOS_ID, EOS_ID, PAD_ID

# The module paths of today (tests/test_legacy_models.py runs this file's helpers with the
# current code) and of 890da67, the flat layout that wrote the fixture.
try:
    from fadat.models.architectures import model_class
    from fadat.models.config import make_config
except ModuleNotFoundError:
    from fadat.architectures import model_class
    from fadat.transformer import make_config

VOCAB = 12
SIZES = dict(
    d_model=16,
    encoder_layers=1,
    decoder_layers=2,
    attention_heads=2,
    ffn_dim=32,
    link_heads=2,
    max_source_positions=16,
    max_target_positions=48,
)
#: name → config overrides; pre_norm adds the final LayerNorms whose names moved too.
MODELS = {
    "dat": dict(model_type="dat"),
    "dat-copy-prenorm": dict(model_type="dat", copy_source=True, pre_norm=True),
    "at-prenorm": dict(model_type="at", pre_norm=True),
    "nat": dict(model_type="nat"),
    "ctc": dict(model_type="ctc", upsample_ratio=3.0),
}

#: the models that also get a checkpoint_last (DAT and AT: the architectures of the long runs)
CHECKPOINTS = ("dat", "at-prenorm")


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(source (3, 7), target (3, 6), target_lengths (3,))`` with padding in both."""
    source = torch.tensor(
        [[5, 6, 7, 8, 9, 10, EOS_ID], [4, 11, 4, EOS_ID, PAD_ID, PAD_ID, PAD_ID],
         [7, EOS_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID]]
    )  # fmt: skip
    target = torch.tensor(
        [[BOS_ID, 5, 6, 7, 8, EOS_ID], [BOS_ID, 11, 4, EOS_ID, PAD_ID, PAD_ID],
         [BOS_ID, 7, EOS_ID, PAD_ID, PAD_ID, PAD_ID]]
    )  # fmt: skip
    return source, target, target.ne(PAD_ID).sum(dim=1)


def network_outputs(model, source, target, mode: str) -> dict[str, torch.Tensor]:
    """The network's fp32 outputs on the batch in ``mode`` (``"eval"`` or ``"train"``, under
    seed 7 for the dropout masks), with autograd."""
    kind = model.config.model_type
    model.train(mode == "train")
    torch.manual_seed(7)
    out = {}
    if kind == "dat":
        lengths = model.graph_lengths(source.ne(PAD_ID).sum(dim=1), decoding=True)
        logprobs, out["links"] = model(source, lengths)
    elif kind == "at":
        logprobs = model(source, target[:, :-1])
    elif kind == "nat":
        logprobs = model(source, target.ne(PAD_ID).sum(dim=1))
        out["length_logprobs"] = model.length_logprobs(model.encode(source))
    else:
        # CTCModel.lengths of 890da67 is graph_lengths since the shared stack
        sizes = getattr(model, "lengths", None) or model.graph_lengths
        logprobs = model(source, sizes(source.ne(PAD_ID).sum(dim=1), True))
    out["logprobs"] = logprobs
    model.eval()
    return out


def forward_outputs(model, source, target) -> dict[str, torch.Tensor]:
    """``network_outputs`` without autograd, in eval mode and, for DAT and AT, in train mode;
    keys ``MODE.NAME``."""
    modes = ("eval", "train") if model.config.model_type in ("dat", "at") else ("eval",)
    with torch.no_grad():
        return {
            f"{mode}.{k}": v.contiguous()
            for mode in modes
            for k, v in network_outputs(model, source, target, mode).items()
        }


def translations(model, source, target, target_lengths) -> dict:
    """``translate_batch`` of every strategy (DAT: also bf16 and int8) as ``(tokens, score)``
    and ``score_batch``."""
    try:
        from fadat.models.inference import with_precision
    except ModuleNotFoundError:  # 890da67
        from fadat.inference import with_precision

    def kept(hyps):
        # (tokens, score) of each hypothesis: what translate_batch returned when the fixture was
        # written; later versions return more fields (fadat.architectures.Scored) first.
        return [[tuple(h[:2]) for h in sentence] for sentence in hyps]

    options = {"sample": {"seed": 3}, "beam": {"beam_size": 3}}
    result = {}
    with torch.no_grad():
        for strategy in model.strategies():
            result[strategy] = kept(
                model.translate_batch(source, strategy, options.get(strategy, {}))
            )
        if model.config.model_type == "dat":
            result["sample-nbest3"] = kept(model.translate_batch(source, "sample", {"seed": 3}, 3))
            for precision in ("bf16", "int8"):
                converted = with_precision(model, precision)
                for strategy in ("greedy", "lookahead", "joint-viterbi"):
                    result[f"{precision}.{strategy}"] = kept(
                        converted.translate_batch(source, strategy, {})
                    )
        result["score"] = list(model.score_batch(source, target, target_lengths))
    return result


def train_step(model, optimizer, source, target) -> None:
    """One AdamW update on a deterministic loss (eval mode: no dropout)."""
    outputs = network_outputs(model, source, target, "eval")
    loss = sum(v.masked_fill(~torch.isfinite(v), 0.0).sum() for v in outputs.values())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def make_optimizer(model) -> torch.optim.Optimizer:
    """AdamW as fadat.train.Trainer builds it."""
    return torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-8)


def save_checkpoint(model, name: str, out: Path, source, target) -> None:
    """checkpoint_last after one update, and the weights after a second one."""
    try:
        from fadat.training.checkpoints import (
            Progress,
            atomic_save,
            capture_rng_state,
            last_state,
        )
    except ModuleNotFoundError:  # 890da67
        from fadat.checkpoints import Progress, atomic_save, capture_rng_state, last_state

    optimizer = make_optimizer(model)
    train_step(model, optimizer, source, target)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    config = {"lr": 1e-3, "warmup": 0, "warmup_init_lr": 1e-7}
    state = last_state(
        model.config.model_type, config, 1, model, optimizer, scaler, Progress(update=1),
        [capture_rng_state()],
    )  # fmt: skip
    atomic_save(state, out / f"{name}.checkpoint_last.pt")
    train_step(model, optimizer, source, target)
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(weights, str(out / f"{name}.after_step2.safetensors"))


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    source, target, target_lengths = batch()
    for name, overrides in MODELS.items():
        torch.manual_seed(sum(map(ord, name)))
        config = make_config("tiny", VOCAB, **{**SIZES, **overrides})
        model = model_class(config.model_type)(config)
        for p in model.parameters():  # BERT init leaves biases and LayerNorms at 0/1
            p.data.add_(0.3 * torch.randn_like(p))
        model.eval()
        model.save_pretrained(out / name)
        save_file(forward_outputs(model, source, target), str(out / f"{name}.outputs.safetensors"))
        text = json.dumps(translations(model, source, target, target_lengths), indent=1)
        (out / f"{name}.translations.json").write_text(text + "\n", encoding="utf-8")
        names = json.dumps([n for n, _ in model.named_parameters()], indent=1)
        (out / f"{name}.parameters.json").write_text(names + "\n", encoding="utf-8")
        if name in CHECKPOINTS:
            save_checkpoint(model, name, out, source, target)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
