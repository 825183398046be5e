"""The last stage of scripts/gpu/job.sh: ``manifest.json`` in OUT and the summary tables.

Reads what the stages wrote (any of them may be missing: a stage failed, was cut or skipped) and
writes ``OUT/manifest.json``:

- ``stages``: each stage's name, status (ok, failed, timed_out, skipped), exit code, seconds,
  budget and output file, from the job's stage record (``--stages``);
- ``files``: every file in OUT with its size and SHA-256 (``job.log`` without a hash: the job
  appends its last lines after this script);
- ``results``: the numbers the issue asks for: the test counts and failures (``junit.xml``), the
  kernel rows (``kernels.json``), the training rows and the pieces timed alone
  (``bench_model.json``), the latency rows (``latency.json``).

and prints the same as Markdown tables (the device tool's reply carries the end of the output).
Needs only the standard library (it must run where torch would not import).
scripts/gpu/sweep_design.py (job-sweep.sh's manifest) reads the stage record and lists OUT's
files with :func:`read_stages` and :func:`list_files`.

Usage: ``python scripts/gpu/summary.py OUT --stages FILE [--commit HASH] [--seconds S]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

#: what the device tool brings back from OUT (/work/.library/device/README.md)
MAX_FILES = 8
MAX_FILE_BYTES = 16 * 2**20


def read_stages(path: Path | None) -> list[dict[str, Any]]:
    """The job's stage record: one tab-separated line per stage (common.sh, ``stage``)."""
    if path is None or not path.exists():
        return []
    stages = []
    for line in path.read_text(encoding="utf-8").splitlines():
        name, status, rc, seconds, budget, file = (line.split("\t") + [""] * 6)[:6]
        stages.append(
            {
                "name": name,
                "status": status,
                "exit": int(rc) if rc else None,
                "seconds": int(seconds or 0),
                "budget_s": int(budget or 0),
                "file": file or None,
            }
        )
    return stages


def read_json(path: Path) -> Any:
    """The parsed file, or None where it is missing or cut short (a stage killed mid-write)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def test_counts(path: Path) -> dict[str, Any] | None:
    """Counts and the failed tests' ids from a pytest JUnit XML file."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time_s": 0.0}
    failed = []
    for suite in root.iter("testsuite"):
        for key in ("tests", "failures", "errors", "skipped"):
            counts[key] += int(suite.get(key, 0))
        counts["time_s"] += float(suite.get("time", 0))
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(f"{case.get('classname')}::{case.get('name')}")
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["failed"] = failed
    return counts


def train_rows(report: dict | None) -> tuple[list[dict], list[dict]]:
    """(every bench_model row, every run's pieces timed alone with its preset and Triton flag)."""
    rows, pieces = [], []
    for run in (report or {}).get("runs", []):
        rows += run["rows"]
        preset = run["rows"][0]["preset"] if run["rows"] else "?"
        triton = run["rows"][0]["dag_triton"] if run["rows"] else False
        for comp in run.get("components", []):
            pieces.append({"preset": preset, "dag_triton": triton, **comp})
    return rows, pieces


def latency_rows(report: dict | None) -> list[dict]:
    keys = ("name", "model", "latency_ms_median", "speedup_latency", "bleu", "tok_bleu")
    keys += ("throughput",)
    return [{k: s.get(k) for k in keys} for s in (report or {}).get("systems", [])]


def fmt(x: Any, spec: str = ".1f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return format(x, spec) if isinstance(x, int | float) and not isinstance(x, bool) else str(x)


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def list_files(out: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Every file in OUT but ``manifest.json`` (which is written last) with its size and SHA-256
    (``job.log`` without a hash: the job appends its last lines after the manifest), and a
    warning for each of the device tool's limits it breaks: more than :data:`MAX_FILES` files
    with the manifest, a file over :data:`MAX_FILE_BYTES`.

    Returns:
        (``[{"name", "bytes", "sha256"}]`` sorted by name, the warnings).
    """
    files = []
    for path in sorted(p for p in out.iterdir() if p.is_file() and p.name != "manifest.json"):
        data = path.read_bytes()
        growing = path.name == "job.log"
        files.append(
            {
                "name": path.name,
                "bytes": len(data),
                "sha256": None if growing else hashlib.sha256(data).hexdigest(),
            }
        )
    warnings = []
    if len(files) + 1 > MAX_FILES:
        warnings.append(f"{len(files) + 1} files in OUT: the device tool brings back {MAX_FILES}")
    warnings += [
        f"{f['name']} is over 16 MiB: it does not come back"
        for f in files
        if f["bytes"] > MAX_FILE_BYTES
    ]
    return files, warnings


def files_lines(manifest: dict[str, Any]) -> list[str]:
    """The lines that end a job's summary: the files in OUT with their sizes (the manifest
    included), then one ``WARNING:`` line per warning of :func:`list_files`."""
    listed = ", ".join(f"{f['name']} ({f['bytes']} B)" for f in manifest["files"])
    lines = [f"{len(manifest['files']) + 1} files in OUT: {listed}, manifest.json"]
    return lines + [f"WARNING: {w}" for w in manifest["warnings"]]


def summarize(out: Path, stages: list[dict], commit: str, seconds: int | None) -> dict[str, Any]:
    """Write OUT/manifest.json; returns it."""
    tests = test_counts(out / "junit.xml")
    kernels = read_json(out / "kernels.json")
    train, pieces = train_rows(read_json(out / "bench_model.json"))
    latency = latency_rows(read_json(out / "latency.json"))
    env = (read_json(out / "latency.json") or {}).get("environment", {})
    device = (
        (kernels or {}).get("device")
        or next((r["device"] for r in train), None)
        or env.get("cuda_device")
        or env.get("device")
    )
    files, warnings = list_files(out)
    manifest = {
        "job": "scripts/gpu/job.sh",
        "commit": commit,
        "seconds": seconds,
        "device": device,
        "stages": stages,
        "files": files,
        "warnings": warnings,
        "results": {
            "tests": tests,
            "kernels": (kernels or {}).get("rows", []),
            "train": [
                {
                    k: r.get(k)
                    for k in (
                        "preset",
                        "variant",
                        "dag_backend",
                        "dag_triton",
                        "batch_sentences",
                        "target_tokens",
                        "tokens_per_s",
                        "peak_mib",
                        "stages_ms",
                    )
                }
                for r in train
            ],
            "train_pieces": pieces,
            "latency": latency,
        },
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def render(manifest: dict[str, Any]) -> str:
    """The summary tables as Markdown."""
    parts = [f"## job.sh on {manifest['device'] or '?'} (commit {manifest['commit']})"]
    parts.append(
        table(
            ["stage", "status", "exit", "s", "budget s"],
            [
                [s["name"], s["status"], fmt(s["exit"], "d"), str(s["seconds"]), str(s["budget_s"])]
                for s in manifest["stages"]
            ],
        )
    )
    res = manifest["results"]
    t = res["tests"]
    if t:
        parts.append(
            f"tests: {t['passed']} passed, {t['failures']} failed, {t['errors']} errors, "
            f"{t['skipped']} skipped in {t['time_s']:.0f} s"
            + "".join(f"\n  FAILED {name}" for name in t["failed"])
        )
    if res["kernels"]:
        parts.append(
            table(
                ["task", "B", "L", "torch ms", "triton ms", "torch/triton", "max Δ"],
                [
                    [r["task"], str(r["batch"]), str(r["size"]), fmt(r["torch_ms"], ".2f")]
                    + [
                        fmt(r["triton_ms"], ".2f"),
                        fmt(r["speedup"], ".2f"),
                        fmt(r["max_diff"], ".1e"),
                    ]
                    for r in res["kernels"]
                ],
            )
        )
    if res["train"]:
        parts.append(
            table(
                ["preset", "variant", "Triton", "B", "tok/s", "peak MiB"],
                [
                    [r["preset"], r["variant"], "yes" if r["dag_triton"] else "no"]
                    + [str(r["batch_sentences"]), fmt(r["tokens_per_s"], ".0f")]
                    + [fmt(r["peak_mib"], ".0f")]
                    for r in res["train"]
                ],
            )
        )
    if res["train_pieces"]:
        names = list(res["train_pieces"][0]["ms"])
        parts.append(
            table(
                ["preset", "Triton", *[f"{n} ms" for n in names], "DAG NLL share"],
                [
                    [p["preset"], "yes" if p["dag_triton"] else "no"]
                    + [fmt(p["ms"].get(n), ".2f") for n in names]
                    + [
                        fmt(
                            p["dag_nll_share_of_fused_step"]
                            and 100 * p["dag_nll_share_of_fused_step"],
                            ".1f",
                        )
                        + " %"
                    ]
                    for p in res["train_pieces"]
                ],
            )
        )
    if res["latency"]:
        parts.append(
            table(
                ["system", "latency ms", "speed-up", "BLEU", "tok BLEU", "sent/s"],
                [
                    [
                        r["name"],
                        fmt(r["latency_ms_median"], ".2f"),
                        fmt(r["speedup_latency"], ".2f"),
                    ]
                    + [
                        fmt(r["bleu"], ".2f"),
                        fmt(r["tok_bleu"], ".2f"),
                        fmt(r["throughput"], ".1f"),
                    ]
                    for r in res["latency"]
                ],
            )
        )
    parts += files_lines(manifest)
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--stages", type=Path, default=None)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--seconds", type=int, default=None)
    args = parser.parse_args(argv)
    manifest = summarize(args.out, read_stages(args.stages), args.commit, args.seconds)
    print(render(manifest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
