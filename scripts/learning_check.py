"""The quick run's learning check: fail unless a training run reached a validation BLEU.

Usage: python scripts/learning_check.py RUN_DIR UPDATES MIN_BLEU

Reads RUN_DIR/valid_log.jsonl (fadat train appends one record per validation). Passes when the
run reached UPDATES updates and its best validation BLEU is >= MIN_BLEU. Prints the best BLEU on
stdout and the verdict, with the BLEU curve, on stderr. Exit codes: 0 passed; 1 failed (BLEU
below MIN_BLEU, or the run stopped before UPDATES updates, e.g. at its time cap); 2 no
validation log.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    run_dir, updates, minimum = Path(argv[0]), int(argv[1]), float(argv[2])
    log = run_dir / "valid_log.jsonl"
    records = []
    if log.is_file():
        records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    if not records:
        print(f"learning check: no validation in {log}", file=sys.stderr)
        return 2
    best = max(record["bleu"] for record in records)
    last = max(record["update"] for record in records)
    curve = ", ".join(f"{r['bleu']:.1f} at update {r['update']}" for r in records)
    print(f"{best:.1f}")
    if last < updates:
        verdict = f"FAILED: the run stopped at update {last} of {updates} (its time cap?)"
    elif best < minimum:
        verdict = f"FAILED: best valid BLEU {best:.1f} < {minimum:g}: training does not learn"
    else:
        verdict = f"passed (best {best:.1f} >= {minimum:g})"
    print(f"learning check {verdict}; valid BLEU {curve}", file=sys.stderr)
    return 0 if verdict.startswith("passed") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
