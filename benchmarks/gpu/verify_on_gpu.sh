#!/usr/bin/env bash
# The GPU checks of docs/gpu.md, on a machine with a CUDA GPU, torch, CuPy and pynvml (nvidia-ml-py).
#
#   benchmarks/gpu/verify_on_gpu.sh [WHEEL_DIR] [OUT_DIR]
#
# Installs byteps (its wheels from WHEEL_DIR, pyzmq among them if the machine
# lacks it; or built from packages/) into a folder on PYTHONPATH, so the
# machine's own torch, CuPy and pynvml stay in use, then:
#   1. the topology read through the real NVML (recorded to OUT_DIR/nvml.json),
#   2. the CUDA tests beside the CPU ones (packages/byteps-torch/tests/test_cuda.py),
#   3. the device staging tests (their stand-in, on this machine's Python),
#   4. the push_pull benchmark against the copy bound and NCCL (MB=25, REPEATS=3 by default),
#   5. local aggregation on the GPU against host memory (2 processes sharing the GPU, same size).
# Each check prints one line, "PASS name (seconds)", "FAIL name (exit code, seconds)" or "SKIP name (why)".
#
# Time budget: BUDGET_S (default 390 s = 6.5 min) for the whole script, install included, so that it ends
# well inside the 7-8 minutes a lent GPU machine usually gives one command. Each check runs under a timeout
# of its own cap or what is left of the budget, whichever is less; a check that no longer fits is skipped.
# Bigger runs: MB=100 REPEATS=10 PAIRS=2 BUDGET_S=900 (the figures of docs/gpu.md were taken so).
# Everything it prints also goes to OUT_DIR (default ./gpu-results).
set -uo pipefail
cd "$(dirname "$0")/../.."
START=$SECONDS
BUDGET_S=${BUDGET_S:-390}
MB=${MB:-25} REPEATS=${REPEATS:-3} PAIRS=${PAIRS:-1}
WHEELS=${1:-}
export OUT_DIR=${2:-gpu-results}
mkdir -p "$OUT_DIR"
SITE=${SITE:-/tmp/byteps-gpu-site}
PY=python3
# the byteps packages WHEEL_DIR lacks are built from packages/ with the machine's scikit-build-core, pybind11,
# cmake and ninja (no isolation: nothing to download), in the same pip call (a second --target call would
# not merge into the byteps/ folder)
wheels=() missing=()
[ -n "$WHEELS" ] && wheels=("$WHEELS"/*.whl)
for name in transport common server launcher torch testkit; do
    ls "${WHEELS:-/nonexistent}"/byteps_${name}-*.whl >/dev/null 2>&1 || missing+=("packages/byteps-$name")
done
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16} timeout 180 "$PY" -m pip install -q --no-index \
    --no-deps --no-build-isolation --no-compile --target "$SITE" "${wheels[@]}" "${missing[@]}" \
    || { echo "FAIL install ($((SECONDS - START)) s)"; exit 3; }
echo "PASS install ($((SECONDS - START)) s)"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT_DIR/gpu.txt"
status=0
# check NAME CAP_S COMMAND...: runs COMMAND under min(CAP_S, what is left of BUDGET_S); one PASS/FAIL/SKIP line
check() {
    local name=$1 cap=$2 left began code
    shift 2
    left=$((BUDGET_S - (SECONDS - START)))
    if [ "$left" -lt 15 ]; then
        echo "SKIP $name (the ${BUDGET_S} s budget is spent)" | tee -a "$OUT_DIR/summary.txt"
        status=1
        return
    fi
    [ "$cap" -gt "$left" ] && cap=$left
    began=$SECONDS
    timeout "$cap" "$@" > "$OUT_DIR/$name.txt" 2>&1
    code=$?
    tail -5 "$OUT_DIR/$name.txt"
    if [ "$code" -eq 0 ]; then
        echo "PASS $name ($((SECONDS - began)) s)" | tee -a "$OUT_DIR/summary.txt"
    else
        [ "$code" -eq 124 ] && code="timed out after $cap s"
        echo "FAIL $name ($code, $((SECONDS - began)) s)" | tee -a "$OUT_DIR/summary.txt"
        status=1
    fi
}
: > "$OUT_DIR/summary.txt"
cat > "$OUT_DIR/topology.py" <<'PY'
import json, os, sys
import pynvml
from byteps.launcher.topology import read_topology
pynvml.nvmlInit()
answers = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    bus = pynvml.nvmlDeviceGetPciInfo(h).busId
    answers.append({"index": i, "busId": bus.decode() if isinstance(bus, bytes) else bus,
                    "uuid": str(pynvml.nvmlDeviceGetUUID(h)), "name": str(pynvml.nvmlDeviceGetName(h))})
pynvml.nvmlShutdown()
json.dump(answers, open(os.path.join(os.environ["OUT_DIR"], "nvml.json"), "w"), indent=2)
topology = read_topology()
print("NVML:", answers)
print("topology:", topology.describe())
print("GPUs:", topology.gpus)
PY
check topology 30 "$PY" "$OUT_DIR/topology.py"
check test_cuda 150 "$PY" -m pytest -v -rs -x packages/byteps-torch/tests/test_cuda.py
check test_device_staging 60 "$PY" -m pytest -q packages/byteps-common/tests/test_device_staging.py
check bench_cuda_push_pull 60 "$PY" benchmarks/gpu/bench_cuda_push_pull.py --mb "$MB" --repeats "$REPEATS" \
    --json "$OUT_DIR/bench.json"
check bench_gpu_local_aggregation 60 "$PY" benchmarks/gpu/bench_gpu_local_aggregation.py --mb "$MB" \
    --repeats "$REPEATS" --pairs "$PAIRS" --json "$OUT_DIR/bench_local.json"
echo "total $((SECONDS - START)) s of a ${BUDGET_S} s budget"
exit $status
