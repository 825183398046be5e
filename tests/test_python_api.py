"""fadat used from Python as a notebook would: prepare a corpus, train a tiny DAT, average it into
a model directory, evaluate it and translate with it, through the top-level functions only, in a
process where building an ``argparse.Namespace`` or a parser fails and ``fadat.cli`` is never
imported (the command line is a layer over these functions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NOTEBOOK = r"""
import argparse, json, random, sys
from pathlib import Path

def refuse(*args, **kwargs):
    raise AssertionError("the library built an argparse object")
argparse.Namespace.__init__ = refuse
argparse.ArgumentParser.__init__ = refuse

import torch
torch.set_num_threads(1)
import fadat

root = Path(sys.argv[1])
rng = random.Random(0)
words = "alpha beta gamma delta omega sigma kappa theta".split()
for split, n in (("train", 400), ("valid", 40)):
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 6))) for _ in range(n)]
    for side in ("src", "tgt"):
        (root / f"{split}.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")

data = fadat.prepare(
    "parallel-text", root / "data",
    source_file=root / "train.src", target_file=root / "train.tgt",
    valid_source_file=root / "valid.src", valid_target_file=root / "valid.tgt",
    source_lang="xx", target_lang="yy", vocab_size=12, model_type="word",
    licence="CC0-1.0", attribution="words  drawn by\n the test",
)
config = fadat.TrainConfig(
    data=str(data), run_dir=str(root / "run"), arch="dat", preset="tiny", lr=5e-3, warmup=50,
    max_updates=200, max_tokens=2048, dropout=0.0, glat_p="0.5:0.1@1k", validate_every=0,
    log_every=1000, progress_bar=False, clip_norm=1.0, seed=1,
)
summary = fadat.train(config)
model = fadat.average([root / "run" / "checkpoint_last.pt"], root / "model", data=data)
report = fadat.evaluate(
    model, data=data, split="valid", strategies=["lookahead", "joint-viterbi"], latency=False,
    bootstrap=0,
)
translator = fadat.Translator.from_pretrained(model)
sentence = (root / "valid.src").read_text(encoding="utf-8").splitlines()[0]
print(json.dumps({
    "data": str(data), "model": str(model), "updates": summary["update"],
    "report": report, "sentence": sentence, "translation": translator.translate([sentence])[0],
    "cli_imported": sorted(m for m in sys.modules if m.split(".")[:2] == ["fadat", "cli"]),
}, default=str))
"""


def test_prepare_train_evaluate_translate_from_python(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", NOTEBOOK, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["cli_imported"] == []
    assert out["data"] == str(tmp_path / "data") and (tmp_path / "data" / "meta.json").is_file()
    assert out["model"] == str(tmp_path / "model")
    assert (tmp_path / "model" / "model.safetensors").is_file()
    # the dataset's licence and attribution (whitespace collapsed) reach the model directory
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    assert (meta["licence"], meta["attribution"]) == ("CC0-1.0", "words drawn by the test")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["data"]["licence"] == "CC0-1.0"
    assert config["data"]["attribution"] == "words drawn by the test"
    assert out["updates"] == 200
    scores = {system["strategy"]: system["bleu"] for system in out["report"]["systems"]}
    assert set(scores) == {"lookahead", "joint-viterbi"}
    # the copy task is half-learned within 200 updates (measured: 70.0 BLEU with both decoders)
    assert min(scores.values()) > 50, scores
    assert isinstance(out["translation"], str) and out["translation"].strip()
