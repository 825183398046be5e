# Shared by scripts/gpu/job.sh, job-train.sh, job-sweep.sh, prepare.sh and unpack-model.sh
# (sourced, not run): the environment of a device command, the stage runner, and the averaging and
# packing of a trained model.
# Expects ROOT (the repository root) and DRY (1 = dry run on this CPU machine).

# The job's clock and output folder: START, DEADLINE (BUDGET_S seconds from now), RESERVE (the
# seconds kept back for what runs after the last stage); OUT (a temporary folder in a dry run
# unless set; the device tool sets it there); STAGES, a tab-separated record of every stage
# (name, status, exit code, seconds, budget, output file) kept outside OUT. Expects BUDGET_S.
start_job() {
  RESERVE=${RESERVE:-5}
  START=$(date +%s)
  DEADLINE=$((START + BUDGET_S))
  if [ "$DRY" = 1 ]; then
    OUT=${OUT:-$(mktemp -d /tmp/gpu-dry.XXXXXX)}
  fi
  : "${OUT:?OUT is not set (the device tool sets it; --dry-run makes one)}"
  mkdir -p "$OUT"
  STAGES=$(mktemp /tmp/gpu-stages.XXXXXX)
  export PYTHONUNBUFFERED=1
}

# This machine's interpreter with fadat's dependencies: the checkout's .venv (README's setup), else
# that of the main checkout when ROOT is a git worktree of it, else python3. Prints its path.
local_python() {
  local common
  if [ -x "$ROOT/.venv/bin/python" ]; then
    echo "$ROOT/.venv/bin/python"
    return 0
  fi
  common=$(git -C "$ROOT" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
  if [ -n "$common" ] && [ -x "$common/../.venv/bin/python" ]; then
    echo "$(cd "$common/.." && pwd)/.venv/bin/python"
  else
    echo python3
  fi
}

# PY, the interpreter: the device image's python3; in a dry run this machine's (PYTHON, else
# local_python). Installs nothing (setup_python does).
pick_python() {
  if [ "$DRY" = 1 ]; then
    PY=${PYTHON:-$(local_python)}
  else
    PY=python3
  fi
}

# Device: the carried wheels into /tmp/site (device README); fadat from the checkout through
# PYTHONPATH (every command below is `python -m ...`, so nothing is installed). Dry run: this
# machine's venv (pick_python).
setup_python() {
  pick_python
  if [ "$DRY" = 1 ]; then
    export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
    return 0
  fi
  if ls "$ROOT"/.whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$ROOT"/.whl/*.whl || echo "setup: installing .whl failed"
    export PYTHONPATH=$ROOT:/tmp/site
  else
    echo "setup: no .whl folder carried (run scripts/gpu/prepare.sh and carry .whl)"
    export PYTHONPATH=$ROOT
  fi
}

# The machine and the software the numbers were taken with.
versions() {
  timeout 30 nvidia-smi 2>/dev/null || echo "nvidia-smi: not available"
  timeout 60 "$PY" - <<'PY' || echo "versions: the check failed"
import sys

import torch

print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, p.total_memory // 2**20, "MiB,", p.multi_processor_count, "SMs")
else:
    print("device: no CUDA")
for name in ("triton", "sacremoses", "sacrebleu", "sentencepiece", "xdist", "pytest_timeout"):
    try:
        module = __import__(name)
        print(name, getattr(module, "__version__", "(no version)"))
    except ImportError as err:
        print(name, "MISSING:", err)
import fadat

print("fadat from", fadat.__file__)
PY
}

# stage NAME MAX_S MIN_S FILE CMD...: run CMD with its output appended to $OUT/FILE, killed after
# min(MAX_S, the seconds left before DEADLINE - RESERVE). A stage with fewer than MIN_S seconds
# left would overrun: it is skipped with a line saying so. MAX_S and MIN_S are multiplied by
# SCALE (default 1; a dry run on a slow CPU gives more). A stage that fails or times out is
# logged and the job goes on. Each stage adds a line to $STAGES.
stage() {
  local name=$1 budget=$(($2 * ${SCALE:-1})) need=$(($3 * ${SCALE:-1})) file=$4
  shift 4
  local left=$((DEADLINE - RESERVE - $(date +%s)))
  [ "$budget" -gt "$left" ] && budget=$left
  if [ "$left" -lt "$need" ]; then
    echo "[$name] SKIPPED: it needs at least ${need}s and ${left}s are left before the" \
      "job's deadline" | tee -a "$OUT/job.log"
    printf '%s\tskipped\t\t0\t%s\t%s\n' "$name" "$left" "$file" >>"$STAGES"
    return 0
  fi
  echo "[$name] start $(date -u +%H:%M:%S), budget ${budget}s: $*" | tee -a "$OUT/job.log"
  local t0 rc status errexit=0
  [[ $- == *e* ]] && errexit=1
  t0=$(date +%s)
  set +e
  timeout -k 10 "$budget" "$@" 2>&1 | tee -a "$OUT/$file"
  rc=${PIPESTATUS[0]}
  [ "$errexit" = 1 ] && set -e
  local took=$(($(date +%s) - t0))
  status=ok
  [ "$rc" != 0 ] && status=failed
  local msg="[$name] exit $rc after ${took}s"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    status=timed_out
    msg="$msg (TIMED OUT at ${budget}s)"
  fi
  echo "$msg" | tee -a "$OUT/job.log"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$took" "$budget" "$file" >>"$STAGES"
  return 0
}

# best_k RUN_DIR [K]: K (default 5), or as many checkpoints as the run validated when fewer (a run
# cut short; fadat average refuses --best K when best.json lists fewer). K when the run has no
# best.json: fadat average then says so.
best_k() {
  "$PY" -c 'import json, sys
k = int(sys.argv[2])
try:
    print(max(1, min(k, len(json.load(open(sys.argv[1]))["checkpoints"]))))
except (OSError, ValueError, KeyError):
    print(k)  # no best.json: fadat average says so' "$1/best.json" "${2:-5}"
}

# pack_model MODEL_DIR: the model directory into $OUT as model.tar.partNN (<= 15 MiB each, what
# the device tool brings back) and model.manifest.json (scripts/gpu/shards.py; unpack-model.sh
# joins them here). Not a stage: the packing gets its time even past the deadline, it is what a
# training job is for. Returns shards.py's exit code.
pack_model() {
  "$PY" "$ROOT/scripts/gpu/shards.py" split "$1" "$OUT" --name model --part-mib 15 2>&1 \
    | tee -a "$OUT/job.log"
  return "${PIPESTATUS[0]}"
}

# list_out JOB: the job's seconds and the files in $OUT into job.log, with a warning when there are
# more than the 8 that the device tool brings back. fadat's record of the outputs it wrote there
# (.fadat-files.json, from evaluate --report) is not a result: it goes, so that it cannot push a
# model part out of the 8 (job.sh drops it before its summary).
list_out() {
  rm -f "$OUT/.fadat-files.json"
  echo "$1 done after $(($(date +%s) - START))s; files in OUT:" | tee -a "$OUT/job.log"
  ls -la "$OUT" | tee -a "$OUT/job.log"
  local n
  n=$(find "$OUT" -maxdepth 1 -type f | wc -l)
  if [ "$n" -gt 8 ]; then
    echo "WARNING: $n files in OUT; the tool brings back 8" | tee -a "$OUT/job.log"
  fi
  return 0
}
