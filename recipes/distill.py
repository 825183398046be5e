"""Sequence-level knowledge distillation (Kim & Rush 2016; FA-DAT paper appendix, Table 6).

Translates the training sources of a prepared dataset with an AT model (beam search, or greedy)
and writes a new dataset directory whose training targets are the AT outputs; valid and test
splits, raw references, sentencepiece model and vocabulary are copied unchanged, so BLEU stays
comparable. Works on token ids (no detokenise/retokenise round trip). Resumable: finished
blocks of sentences are kept in ``OUTPUT/distill.partial.jsonl`` and skipped when re-run.

Usage::

    python recipes/distill.py --model runs/at-cpu-small-model --data data/bible-en-es \
        --output data/bible-en-es-distill [--beam 5] [--threads 2] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

from fadat.data.binarized import BinarizedDataset, read_meta, write_split
from fadat.data.contract import BOS_ID, EOS_ID, pad_sequences
from fadat.model_dir import load_pretrained


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="AT model directory")
    p.add_argument("--data", required=True, help="prepared dataset (its train split is distilled)")
    p.add_argument("--output", required=True)
    p.add_argument("--beam", type=int, default=5, help="beam size (1 = greedy)")
    p.add_argument("--length-penalty", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=64, help="sentences per batch")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    model = load_pretrained(args.model).eval()
    if model.config.model_type != "at":
        raise SystemExit(f"{args.model}: distillation needs an AT model")
    data, out = Path(args.data), Path(args.output)
    meta = read_meta(data)
    if meta["vocab_size"] != model.config.vocab_size:
        raise SystemExit(
            f"{args.model}: vocabulary size {model.config.vocab_size} differs from "
            f"{data / 'meta.json'}'s {meta['vocab_size']}"
        )
    out.mkdir(parents=True, exist_ok=True)
    train = BinarizedDataset(data, "train")
    n = len(train)
    partial = out / "distill.partial.jsonl"
    done: dict[int, list[int]] = {}
    if partial.exists():
        # A run killed mid-write leaves a last line without its newline: drop that fragment
        # (its block is translated again) and keep every complete line.
        lines = partial.read_text(encoding="utf-8").split("\n")[:-1]
        for line in lines:
            if line:
                rec = json.loads(line)
                done[rec["id"]] = rec["target"]
        partial.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    # Longest first, so the slowest batches come first and the time estimate is honest.
    order = sorted((i for i in range(n) if i not in done), key=lambda i: -train.source_lengths[i])
    start = time.perf_counter()
    with open(partial, "a", encoding="utf-8") as fh, torch.inference_mode():
        for k in range(0, len(order), args.batch):
            ids = order[k : k + args.batch]
            source = pad_sequences([train[i][0].tolist() for i in ids])  # (B, S)
            if args.beam > 1:
                hyps = model.beam_search(source, args.beam, args.length_penalty)
            else:
                hyps = model.greedy(source, length_penalty=args.length_penalty)
            for i, hyp in zip(ids, hyps, strict=True):
                target = [BOS_ID, *hyp.tokens, EOS_ID]
                done[i] = target
                fh.write(json.dumps({"id": i, "target": target}) + "\n")
            fh.flush()
            rate = (k + len(ids)) / (time.perf_counter() - start)
            print(f"{len(done)}/{n} sentences, {rate:.1f} sent/s", flush=True)
    sources = [train[i][0].tolist() for i in range(n)]
    write_split(out, "train", sources, [done[i] for i in range(n)], meta["vocab_size"])
    for f in data.iterdir():
        if f.name.startswith(("valid.", "test.", "spm.")):
            shutil.copyfile(f, out / f.name)
    if (data / "raw").is_dir():
        shutil.copytree(data / "raw", out / "raw", dirs_exist_ok=True)
    lengths = [len(done[i]) for i in range(n)]
    meta["splits"]["train"]["target_tokens"] = {
        "mean": round(sum(lengths) / n, 2),
        "max": max(lengths),
    }
    meta["distilled"] = {"teacher": str(args.model), "beam": args.beam, "from": str(data)}
    (out / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False), encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
