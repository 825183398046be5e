# Shared by scripts/gpu/job-*.sh (sourced, not run): the environment of a device command and the
# stage runner. Expects ROOT (the repository root) and DRY (1 = dry run on this CPU machine).

# The job's clock and output folder: START, DEADLINE (BUDGET_S seconds from now), RESERVE; OUT
# (a temporary folder in a dry run; the device tool sets it there). Expects BUDGET_S.
start_job() {
  RESERVE=5
  START=$(date +%s)
  DEADLINE=$((START + BUDGET_S))
  if [ "$DRY" = 1 ]; then
    OUT=${OUT:-$(mktemp -d /tmp/gpu-dry.XXXXXX)}
  fi
  : "${OUT:?OUT is not set (the device tool sets it; --dry-run makes one)}"
  mkdir -p "$OUT"
  export PYTHONUNBUFFERED=1
}

# Device: the carried wheels into /tmp/site (device README), then fadat itself. Dry run: this
# machine's venv, the worktree first on the path.
setup_python() {
  if [ "$DRY" = 1 ]; then
    PY=${PY:-/work/main/.venv/bin/python}
    export PYTHONPATH=$ROOT:/work/tools${PYTHONPATH:+:$PYTHONPATH}
    return 0
  fi
  PY=python3
  if ls "$ROOT"/.whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$ROOT"/.whl/*.whl || echo "setup: installing .whl failed"
    export PYTHONPATH=/tmp/site
  else
    echo "setup: no .whl folder carried (run scripts/gpu/prepare.sh and carry .whl)"
  fi
  # No registry there: build with the image's setuptools (no isolated build environment).
  # If the editable install fails, ROOT on the path and `python3 -m fadat.cli` still work.
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e "$ROOT" \
    || echo "setup: pip install -e failed; using PYTHONPATH"
  export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
}

# The machine and the software the numbers were taken with.
versions() {
  timeout 30 nvidia-smi 2>/dev/null || echo "nvidia-smi: not available"
  timeout 60 "$PY" - <<'PY'
import sys

import torch

print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, p.total_memory // 2**20, "MiB,", p.multi_processor_count, "SMs")
else:
    print("device: no CUDA")
try:
    import triton

    print("triton", triton.__version__)
except ImportError as err:
    print("triton missing:", err)
import fadat

print("fadat from", fadat.__file__)
PY
}

# stage NAME BUDGET_S FILE CMD...: run CMD with its output appended to $OUT/FILE and the job
# log, killed after min(BUDGET_S, time left before DEADLINE - RESERVE) seconds. A stage that
# fails or times out is logged and the job goes on.
stage() {
  local name=$1 budget=$2 file=$3
  shift 3
  local left=$((DEADLINE - RESERVE - $(date +%s)))
  [ "$budget" -gt "$left" ] && budget=$left
  if [ "$budget" -lt 5 ]; then
    echo "[$name] SKIPPED: no time left before the job's deadline" | tee -a "$OUT/job.log"
    return 0
  fi
  echo "[$name] start $(date -u +%H:%M:%S), budget ${budget}s: $*" | tee -a "$OUT/job.log"
  local t0 rc
  t0=$(date +%s)
  timeout -k 10 "$budget" "$@" 2>&1 | tee -a "$OUT/$file"
  rc=${PIPESTATUS[0]}
  local msg="[$name] exit $rc after $(($(date +%s) - t0))s"
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && msg="$msg (TIMED OUT at ${budget}s)"
  echo "$msg" | tee -a "$OUT/job.log"
  return 0
}
