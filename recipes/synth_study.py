"""Does fuzzy alignment fix multi-modality? The study on the synthetic multi-modal corpus.

One command runs (or resumes) everything; every stage is skipped when its result exists and a
training stage interrupted by a kill resumes from its last checkpoint:

    python recipes/synth_study.py run [--root runs/synth-study] [--jobs 1]
    python recipes/synth_study.py table [--root runs/synth-study]     # the tables, at any time

Arms (every training run one thread, bf16 autocast; ``--jobs 2`` runs two at a time):

- data: ``fadat prepare synth-multimodal`` at three modality levels (P, Q) = ``LEVELS``, a small
  corpus (``DATA_OPTIONS``: few source word types, short sentences) so that a small model
  converges in minutes;
- DA-T: NLL + glancing pre-training for ``PRETRAIN_UPDATES`` updates
  (``configs/synth-dat-nll.yaml``, λ = 4), validated every 10 %; converged when the valid NLL
  per token at the last validation differs from the one at 80 % of the updates by less than
  ``CONVERGED_REL`` of its value or ``CONVERGED_ABS`` nats (``table`` prints the check);
- from that checkpoint, M = ``FINETUNE_UPDATES`` updates of NLL continued
  (``configs/synth-dat-nll-finetune.yaml``) and of FA-DAT fine-tuning
  (``configs/synth-dat-fuzzy.yaml``, n = 2), identical except for the objective;
- on the medium level also FA-DAT with n = 1, 3, 4 (paper Table 1) and DA-T / NLL-continued /
  FA-DAT at λ = 2, 3, 6, 8 (paper Figure 2);
- AT: ``configs/synth-at.yaml`` (beam 5), the reference point;
- evaluation: ``fadat evaluate`` on the test split (lookahead, and greedy for the modality
  table), whose valid-set metrics give exact-valid rate, BLEU against the valid set and the
  single reference, mixtures, repeated tokens, length error.

Seeds 1, 2, 3 for every arm (the data is the same for all seeds: data seed 1). ``table`` gives
mean ± sd over seeds and, per seed, paired tests of FA-DAT against NLL-continued: paired
bootstrap of BLEU against the valid set (1,000 resamples) and an exact McNemar test of the
exact-valid rate; across seeds a paired t-test of the per-seed differences.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
# This checkout's fadat, also in the worker processes (they import this file again).
sys.path.insert(0, str(REPO))

LEVELS = {"det": (0.0, 0.0), "med": (0.25, 0.25), "high": (0.5, 0.5)}
DATA_OPTIONS = ["--source-types", "60", "--max-words", "10", "--train-size", "20000", "--seed", "1"]
SEEDS = (1, 2, 3)
PRETRAIN_UPDATES = 1200
FINETUNE_UPDATES = 100
AT_UPDATES = 3000
LAMBDAS = (2, 3, 4, 6, 8)
NGRAMS = (1, 2, 3, 4)
CONVERGED_REL = 0.01
CONVERGED_ABS = 0.005
BOOTSTRAP = 1000


@dataclass
class Job:
    """One step of the study: ``fadat`` command lines run in order, done when ``done`` exists.

    A training job's first command is replaced by ``fadat train --resume RUN`` when the run
    has a checkpoint (an interrupted run), and its run directory is removed when it has none.
    """

    name: str
    phase: int  # priority: among the jobs that can start, the lowest phase first
    commands: list[list[str]]
    done: Path
    run_dir: Path | None = None
    max_updates: int = 0  # a training job's update budget (resumed runs are held to it)


def write_config(root: Path, name: str, base: str, **changes) -> Path:
    """``ROOT/configs/NAME.yaml``: configs/BASE with ``changes`` (``model`` keys merged)."""
    cfg = yaml.safe_load((REPO / "configs" / base).read_text(encoding="utf-8"))
    model = {**(cfg.get("model") or {}), **changes.pop("model", {})}
    if model:
        cfg["model"] = model
    cfg.update(changes)
    path = root / "configs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = f"# written by recipes/synth_study.py from configs/{base}\n" + yaml.safe_dump(cfg)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path


def _train(name: str, phase: int, root: Path, config: Path, data: Path, *extra: str) -> Job:
    run = root / "runs" / name
    model = root / "models" / name
    budget = int(yaml.safe_load(config.read_text(encoding="utf-8"))["max_updates"])
    return Job(
        name=name,
        phase=phase,
        max_updates=budget,
        commands=[
            [
                "train",
                "--config",
                str(config),
                "--data",
                str(data),
                "--run-dir",
                str(run),
                "--bf16",
                "--threads",
                "1",
                "--no-progress-bar",
                *extra,
            ],
            ["average", "--checkpoints", str(run / "checkpoint_last.pt"), "--output", str(model)],
        ],
        done=model / "config.json",
        run_dir=run,
    )


def dat_tags() -> list[tuple[str, int, int]]:
    """(level, λ, seed) of every DA-T pre-training."""
    return [
        (level, lam, seed)
        for level in LEVELS
        for lam in (LAMBDAS if level == "med" else (4,))
        for seed in SEEDS
    ]


def _evaluate(name: str, phase: int, root: Path, data: Path, models: list[str], *extra: str) -> Job:
    report = root / "eval" / f"{name}.json"
    command = [
        "evaluate",
        "--model",
        *models,
        "--data",
        str(data),
        "--split",
        "test",
        "--no-latency",
        "--bootstrap",
        "0",
        "--threads",
        "1",
        "--report",
        str(report),
        "--save-hypotheses",
        str(root / "eval" / name),
        *extra,
    ]
    return Job(f"eval-{name}", phase, [command], report)


def plan(root: Path) -> list[Job]:
    """Every job of the study. Phases run in order, so that the modality-level comparison of
    the DA-T arms (0–3) finishes first, then the AT reference (4–5), paper Table 1 (6–7) and
    paper Figure 2 (8–10)."""
    jobs: list[Job] = []
    data = {level: root / "data" / level for level in LEVELS}
    for level, (p, q) in LEVELS.items():
        command = [
            "prepare",
            "synth-multimodal",
            "--output",
            str(data[level]),
            "--swap-prob",
            str(p),
            "--synonym-prob",
            str(q),
            *DATA_OPTIONS,
        ]
        jobs.append(Job(f"data-{level}", 0, [command], data[level] / "meta.json"))
    finetune = {
        "nll": write_config(
            root, "finetune-nll", "synth-dat-nll-finetune.yaml", max_updates=FINETUNE_UPDATES
        )
    }
    for n in NGRAMS:
        finetune[f"fuzzy-n{n}"] = write_config(
            root,
            f"finetune-fuzzy-n{n}",
            "synth-dat-fuzzy.yaml",
            max_updates=FINETUNE_UPDATES,
            ngram_order=n,
        )
    at_config = write_config(root, "at", "synth-at.yaml", max_updates=AT_UPDATES)
    model = lambda name: str(root / "models" / name)  # noqa: E731
    for level, lam, seed in dat_tags():
        figure2 = lam != 4
        pre_config = write_config(
            root,
            f"pretrain-l{lam}",
            "synth-dat-nll.yaml",
            max_updates=PRETRAIN_UPDATES,
            validate_every=PRETRAIN_UPDATES // 10,
            model={"upsample_ratio": float(lam)},
        )
        tag = f"{level}-l{lam}-s{seed}"
        jobs.append(
            _train(
                f"pre-{tag}",
                8 if figure2 else 1,
                root,
                pre_config,
                data[level],
                "--seed",
                str(seed),
            )
        )
        for arm in ("nll", "fuzzy-n2"):
            jobs.append(
                _train(
                    f"{arm}-{tag}",
                    9 if figure2 else 2,
                    root,
                    finetune[arm],
                    data[level],
                    "--seed",
                    str(seed),
                    "--init-from",
                    model(f"pre-{tag}"),
                )
            )
        strategies = "lookahead" if figure2 else "greedy,lookahead"
        models = [model(f"{arm}-{tag}") for arm in ("pre", "nll", "fuzzy-n2")]
        jobs.append(
            _evaluate(
                tag, 10 if figure2 else 3, root, data[level], models, "--strategies", strategies
            )
        )
        if (level, lam) == ("med", 4):
            others = [f"fuzzy-n{n}" for n in NGRAMS if n != 2]
            for arm in others:
                jobs.append(
                    _train(
                        f"{arm}-{tag}",
                        6,
                        root,
                        finetune[arm],
                        data[level],
                        "--seed",
                        str(seed),
                        "--init-from",
                        model(f"pre-{tag}"),
                    )
                )
            jobs.append(
                _evaluate(
                    f"n-{tag}",
                    7,
                    root,
                    data[level],
                    [model(f"{a}-{tag}") for a in others],
                    "--strategies",
                    "lookahead",
                )
            )
    for level in LEVELS:
        for seed in SEEDS:
            tag = f"{level}-s{seed}"
            jobs.append(_train(f"at-{tag}", 4, root, at_config, data[level], "--seed", str(seed)))
            jobs.append(
                _evaluate(
                    f"at-{tag}", 5, root, data[level], [model(f"at-{tag}")], "--at-beam-size", "5"
                )
            )
    return jobs


# ----------------------------------------------------------------------------- running


def _log(root: Path, message: str) -> None:
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} {message}"
    print(line, flush=True)
    with open(root / "study.log", "a", encoding="utf-8") as f:
        f.write(line + "\n")


def _trained(job: Job) -> bool:
    """Whether a training job's run reached its current update budget (``DONE`` holds it)."""
    marker = job.run_dir / "DONE"
    return marker.is_file() and marker.read_text(encoding="utf-8").strip() == str(job.max_updates)


def is_done(job: Job) -> bool:
    """Finished, and for a training job trained to its current budget (a larger budget in the
    recipe continues the run)."""
    return job.done.exists() and (job.run_dir is None or _trained(job))


def _commands(job: Job) -> list[list[str]]:
    """The job's commands, with an interrupted training run resumed."""
    if job.run_dir is None:
        return job.commands
    if (job.run_dir / "checkpoint_last.pt").is_file():
        resume = ["train", "--resume", str(job.run_dir), "--threads", "1", "--no-progress-bar"]
        return [resume + ["--max-updates", str(job.max_updates)], *job.commands[1:]]
    if job.run_dir.exists():
        shutil.rmtree(job.run_dir)  # killed before its first checkpoint: start again
    return job.commands


def run_job(job: Job) -> tuple[str, int, float]:
    """Run one job in this process (the CLI's ``main`` per command; imports are paid once)."""
    import torch

    from fadat import cli

    start = time.time()
    code = 0
    for argv in _commands(job):
        if argv[0] == "train" and _trained(job):
            continue  # trained earlier; the average was interrupted
        code = cli.main(argv)
        torch.set_num_threads(1)
        if code != 0:
            break
        if argv[0] == "train":
            (job.run_dir / "DONE").write_text(f"{job.max_updates}\n", encoding="utf-8")
    return job.name, code, time.time() - start


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def dependencies(jobs: list[Job]) -> dict[str, set[str]]:
    """Job name → the jobs it needs: those whose output directory (a dataset, a model) is an
    argument of one of its commands."""
    producers = {
        str(j.done.parent): j.name for j in jobs if j.done.name in ("meta.json", "config.json")
    }
    return {
        j.name: {producers[a] for c in j.commands for a in c if a in producers} - {j.name}
        for j in jobs
    }


GROUPS = ((0, 3), (4, 5), (6, 7), (8, 10))  # phases of: DA-T arms, AT, Table 1, Figure 2


def priority(job: Job) -> tuple[int, int, int]:
    """Start order: part of the study (GROUPS), then seed, then phase, so that an interrupted
    study has whole seeds of its first parts (a seed's comparison complete before the next)."""
    group = next(k for k, (lo, hi) in enumerate(GROUPS) if lo <= job.phase <= hi)
    seed = int(job.name.rsplit("-s", 1)[1]) if re.search(r"-s\d+$", job.name) else 0
    return group, seed, job.phase


def run(root: Path, jobs_at_once: int, only: str | None) -> int:
    """Run every unfinished job, ``jobs_at_once`` processes at a time: among the jobs whose
    dependencies have finished, the first by :func:`priority`."""
    import multiprocessing

    root.mkdir(parents=True, exist_ok=True)
    os.environ["OMP_NUM_THREADS"] = "1"
    every = plan(root)
    needs = dependencies(every)
    finished = {j.name for j in every if is_done(j)}
    jobs = [j for j in every if only is None or only in j.name]
    pending = sorted((j for j in jobs if j.name not in finished), key=priority)
    _log(root, f"{len(pending)} of {len(jobs)} jobs to run, {jobs_at_once} at a time")
    times_path = root / "times.json"
    times = json.loads(times_path.read_text()) if times_path.is_file() else {}
    failed: list[str] = []
    running: dict[str, tuple[Job, object]] = {}
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(jobs_at_once, initializer=_init_worker) as pool:
        while pending or running:
            for name, (job, result) in list(running.items()):
                if not result.ready():
                    continue
                del running[name]
                _, code, seconds = result.get()
                entry = times.setdefault(name, {"seconds": 0.0})
                entry["seconds"] = round(entry["seconds"] + seconds, 1)
                entry["commands"] = ["fadat " + " ".join(c) for c in job.commands]
                tmp = times_path.with_suffix(".tmp")
                tmp.write_text(json.dumps(times, indent=1) + "\n", encoding="utf-8")
                tmp.replace(times_path)
                if code == 0 and is_done(job):
                    finished.add(name)
                    _log(root, f"done {name} ({seconds:.0f} s)")
                else:
                    failed.append(name)
                    _log(root, f"FAILED {name} (exit {code})")
            if failed:
                pending = []  # after a failure or an interrupt: let the running jobs finish
            for job in list(pending):
                if len(running) >= jobs_at_once:
                    break
                if needs[job.name] <= finished:
                    pending.remove(job)
                    _log(root, f"start {job.name}")
                    running[job.name] = (job, pool.apply_async(_run_job_safely, (job,)))
            if pending and not running:
                _log(root, "no job can start: " + ", ".join(j.name for j in pending[:5]))
                break
            time.sleep(1.0)
    _log(root, "finished" if not failed else f"stopped: {len(failed)} failed ({', '.join(failed)})")
    return 1 if failed else 0


def _run_job_safely(job: Job) -> tuple[str, int, float]:
    import traceback

    try:
        return run_job(job)
    except (Exception, SystemExit):  # reported; the phase's other jobs go on
        traceback.print_exc()
        return job.name, 1, 0.0


# ----------------------------------------------------------------------------- tables


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}"


def t_test_p(diffs: list[float]) -> float:
    """Two-sided p of the paired t-test (Student's t with n − 1 degrees of freedom)."""
    n = len(diffs)
    if n < 2:
        return math.nan
    sd = statistics.stdev(diffs)
    if sd == 0:
        return 0.0 if statistics.fmean(diffs) != 0 else 1.0
    t = abs(statistics.fmean(diffs)) / (sd / math.sqrt(n))
    df = n - 1
    # With T = √df·tan θ the tail P(|T| > t) = 2 ∫ c √df cos^(df−1) θ dθ over [atan(t/√df), π/2]
    # (c the t density's constant): a smooth integrand on a finite range, Simpson's rule.
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    lo, hi = math.atan(t / math.sqrt(df)), math.pi / 2
    steps = 2000
    h = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        w = 1 if i in (0, steps) else (4 if i % 2 else 2)
        total += w * math.cos(lo + i * h) ** (df - 1)
    return min(1.0, 2 * c * math.sqrt(df) * total * h / 3)


def mcnemar_p(a: list[bool], b: list[bool]) -> float:
    """Exact two-sided McNemar test of two paired success lists (binomial on discordant pairs)."""
    only_a = sum(x and not y for x, y in zip(a, b, strict=True))
    only_b = sum(y and not x for x, y in zip(a, b, strict=True))
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def bootstrap_p(hyps_a: list[str], hyps_b: list[str], refs: list[list[str]], seed: int) -> float:
    """Paired bootstrap (sentence resampling, ``BOOTSTRAP`` times) of corpus BLEU against the
    listed valid translations: the share of resamples where B is not better than A (one-sided,
    doubled for a two-sided p), with the observed difference's sign."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(tokenize="none")
    width = max(len(r) for r in refs)
    streams = [[r[k] if k < len(r) else None for r in refs] for k in range(width)]
    sa = np.array(bleu._extract_corpus_statistics(hyps_a, streams), dtype=np.float64)
    sb = np.array(bleu._extract_corpus_statistics(hyps_b, streams), dtype=np.float64)
    score = lambda s: bleu._compute_score_from_stats(list(s)).score  # noqa: E731
    observed = score(sb.sum(0)) - score(sa.sum(0))
    rng = np.random.default_rng(seed)
    n = len(hyps_a)
    worse = 0
    for _ in range(BOOTSTRAP):
        idx = rng.integers(n, size=n)
        d = score(sb[idx].sum(0)) - score(sa[idx].sum(0))
        worse += (d <= 0) if observed > 0 else (d >= 0)
    return min(1.0, 2 * (worse + 1) / (BOOTSTRAP + 1))


METRICS = (
    ("exact valid %", "exact_valid"),
    ("BLEU (valid set)", "bleu_multi"),
    ("BLEU (1 ref)", "bleu_single"),
    ("mixtures %", "mixture_rate"),
    ("repeated tok %", "repeated_tokens"),
    ("len err", "length_error"),
)


def _all_scores(root: Path) -> dict[str, dict]:
    """Valid-set scores of every evaluated system, by system name ("ARM-TAG:STRATEGY")."""
    out = {}
    for path in sorted((root / "eval").glob("*.json")):
        for s in json.loads(path.read_text(encoding="utf-8"))["systems"]:
            out[s["name"]] = {**s["validset"], "hypotheses": path.with_suffix("") / s["name"]}
    return out


_SCORES: dict[str, dict] = {}


def _scores(root: Path, tag: str, arm: str, strategy: str) -> dict | None:
    if not _SCORES:
        _SCORES.update(_all_scores(root))
    return _SCORES.get(f"{arm}-{tag}:{strategy}")


def _hyps(root: Path, tag: str, arm: str, strategy: str) -> list[str]:
    name = str(_scores(root, tag, arm, strategy)["hypotheses"])
    path = Path(name.replace(":", ".") + ".txt")
    return path.read_text(encoding="utf-8").splitlines()


def _row(label: str, runs: list[dict | None]) -> str:
    runs = [r for r in runs if r is not None]
    cells = [_mean_sd([r[k] for r in runs]) for _, k in METRICS]
    return f"| {label} | {len(runs)} | " + " | ".join(cells) + " |"


def _header(first: str) -> list[str]:
    names = [m for m, _ in METRICS]
    return [
        f"| {first} | seeds | " + " | ".join(names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]


def _paired(root: Path, level: str, lam: int, arm: str, strategy: str) -> list[str]:
    """Per-seed FA-DAT arm − NLL-continued differences with their tests, and the t-test."""
    from fadat.data.synth import read_listed_references, read_valid_sets

    data = root / "data" / level
    sets = read_valid_sets(data, "test")
    if sets is None:
        return []
    listed = read_listed_references(data, "test")
    lines = []
    d_bleu, d_valid = [], []
    for seed in SEEDS:
        tag = f"{level}-l{lam}-s{seed}"
        a, b = _scores(root, tag, "nll", strategy), _scores(root, tag, arm, strategy)
        if a is None or b is None:
            continue
        ha, hb = _hyps(root, tag, "nll", strategy), _hyps(root, tag, arm, strategy)
        va = [v.contains(h.split()) for v, h in zip(sets, ha, strict=True)]
        vb = [v.contains(h.split()) for v, h in zip(sets, hb, strict=True)]
        d_bleu.append(b["bleu_multi"] - a["bleu_multi"])
        d_valid.append(b["exact_valid"] - a["exact_valid"])
        p_bleu = bootstrap_p(ha, hb, listed, seed)
        lines.append(
            f"| {level} λ={lam} s{seed} | {d_bleu[-1]:+.2f} | {p_bleu:.3f} "
            f"| {d_valid[-1]:+.2f} | {mcnemar_p(va, vb):.3g} "
            f"| {a['mixtures']} → {b['mixtures']} |"
        )
    if len(d_bleu) > 1:
        lines.append(
            f"| {level} λ={lam} mean | {statistics.fmean(d_bleu):+.2f} | t-test p = "
            f"{t_test_p(d_bleu):.3f} | {statistics.fmean(d_valid):+.2f} | t-test p = "
            f"{t_test_p(d_valid):.3f} | |"
        )
    return lines


def entropy_per_token(root: Path, level: str, sentences: int) -> float:
    """Entropy of the generating process (nats per target token, <s> and </s> counted, as the
    valid NLL is) over the first ``sentences`` valid sentences: the lowest valid NLL possible.

    Per sentence: the swap decisions (H(K) = h(P) + P·H(K − 2) + (1 − P)·H(K − 1) for K
    phrases, h the binary entropy) plus log 2 per word with two synonyms.
    """
    from fadat.data.synth import read_valid_sets

    p = LEVELS[level][0]
    h = 0.0 if p in (0.0, 1.0) else -(p * math.log(p) + (1 - p) * math.log(1 - p))
    total, tokens = 0.0, 0
    for vs in (read_valid_sets(root / "data" / level, "valid") or [])[:sentences]:
        swaps = [0.0, 0.0]
        for k in range(2, len(vs.phrases) + 1):
            swaps.append(h + p * swaps[k - 2] + (1 - p) * swaps[k - 1])
        synonyms = sum(math.log(len(w)) for phrase in vs.phrases for w in phrase)
        total += swaps[len(vs.phrases)] + synonyms
        tokens += vs.length() + 2
    return total / max(tokens, 1)


def convergence(root: Path) -> list[str]:
    """The pre-training convergence check of every DA-T run."""
    lines = [
        "| pre-training | valid NLL @80% | @100% | change | data entropy | valid BLEU @80% / "
        "@100% | converged |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    subset = yaml.safe_load((REPO / "configs" / "synth-dat-nll.yaml").read_text())["valid_subset"]
    for level, lam, seed in dat_tags():
        path = root / "runs" / f"pre-{level}-l{lam}-s{seed}" / "valid_log.jsonl"
        if not path.is_file():
            continue
        log = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            log[entry["update"]] = entry
        at80, at100 = log.get(int(0.8 * PRETRAIN_UPDATES)), log.get(PRETRAIN_UPDATES)
        if at80 is None or at100 is None:
            continue
        change = at100["valid_loss"] - at80["valid_loss"]
        ok = abs(change) < max(CONVERGED_REL * at100["valid_loss"], CONVERGED_ABS)
        lines.append(
            f"| {level} λ={lam} s{seed} | {at80['valid_loss']:.4f} | {at100['valid_loss']:.4f} "
            f"| {change:+.4f} | {entropy_per_token(root, level, subset):.4f} "
            f"| {at80['bleu']:.2f} / {at100['bleu']:.2f} "
            f"| {'yes' if ok else 'NO'} |"
        )
    return lines


def tables(root: Path) -> str:
    """The study's tables as markdown (whatever has finished so far)."""
    out = [f"Study root: {root}; test split, {len(SEEDS)} seeds, mean ± sd over seeds.", ""]
    out += [
        "**Convergence of the pre-training** (criterion: |Δ valid NLL| between 80 % and "
        f"100 % of the updates < max({CONVERGED_REL:.0%} of it, {CONVERGED_ABS} nats))",
        "",
    ]
    out += convergence(root) + [""]
    out += ["**Modality levels** (λ = 4, lookahead; AT beam 5)", ""]
    for level, (p, q) in LEVELS.items():
        out += [f"{level}: P = {p}, Q = {q}", ""] + _header("system")
        for arm, label in (
            ("pre", "DA-T (pre-trained)"),
            ("nll", "DA-T + NLL continued"),
            ("fuzzy-n2", "FA-DAT (n = 2)"),
        ):
            for strategy in ("lookahead", "greedy"):
                runs = [_scores(root, f"{level}-l4-s{s}", arm, strategy) for s in SEEDS]
                out.append(_row(f"{label}, {strategy}", runs))
        at = [_scores(root, f"{level}-s{s}", "at", "beam5") for s in SEEDS]
        out += [_row("AT beam 5", at), ""]
    paired_header = [
        "| setting | Δ BLEU (valid set) | p (bootstrap) | Δ exact valid | p (McNemar) "
        "| mixtures NLL → FA-DAT |",
        "|---|---:|---:|---:|---:|---|",
    ]
    out += ["**FA-DAT (n = 2) − NLL continued, per seed** (lookahead, same checkpoint)", ""]
    out += paired_header
    for level in LEVELS:
        out += _paired(root, level, 4, "fuzzy-n2", "lookahead")
    out += ["", "**Paper Table 1 on med: n** (λ = 4, lookahead)", ""] + _header("system")
    out.append(
        _row(
            "DA-T (pre-trained)", [_scores(root, f"med-l4-s{s}", "pre", "lookahead") for s in SEEDS]
        )
    )
    out.append(
        _row("NLL continued", [_scores(root, f"med-l4-s{s}", "nll", "lookahead") for s in SEEDS])
    )
    for n in NGRAMS:
        runs = [_scores(root, f"med-l4-s{s}", f"fuzzy-n{n}", "lookahead") for s in SEEDS]
        out.append(_row(f"FA-DAT n = {n}", runs))
    out += ["", "**Paper Figure 2 on med: λ** (lookahead)", ""] + _header("system")
    for lam in LAMBDAS:
        for arm, label in (("pre", "DA-T"), ("nll", "NLL continued"), ("fuzzy-n2", "FA-DAT")):
            runs = [_scores(root, f"med-l{lam}-s{s}", arm, "lookahead") for s in SEEDS]
            out.append(_row(f"λ = {lam}: {label}", runs))
    out += ["", "FA-DAT − NLL continued per λ:", ""] + paired_header
    for lam in LAMBDAS:
        out += _paired(root, "med", lam, "fuzzy-n2", "lookahead")
    times_path = root / "times.json"
    if times_path.is_file():
        times = json.loads(times_path.read_text(encoding="utf-8"))
        groups: dict[str, float] = {}
        for name, entry in times.items():
            key = name.split("-")[0] if not name.startswith("eval") else "eval"
            groups[key] = groups.get(key, 0.0) + entry["seconds"]
        out += [
            "",
            "Wall time per kind of job (minutes, summed over jobs): "
            + ", ".join(f"{k} {v / 60:.1f}" for k, v in sorted(groups.items()))
            + f"; total {sum(groups.values()) / 60:.1f}",
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run or resume the study")
    r.add_argument("--root", default="runs/synth-study")
    r.add_argument("--jobs", type=int, default=1, help="processes at a time (1 thread each)")
    r.add_argument("--only", help="only jobs whose name contains this")
    t = sub.add_parser("table", help="print the tables (and write ROOT/tables.md)")
    t.add_argument("--root", default="runs/synth-study")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    if args.command == "run":
        code = run(root, args.jobs, args.only)
    else:
        code = 0
    if (root / "runs").is_dir():
        text = tables(root)
        (root / "tables.md").write_text(text + "\n", encoding="utf-8")
        print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
