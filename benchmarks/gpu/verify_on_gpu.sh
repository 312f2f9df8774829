#!/usr/bin/env bash
# The GPU checks of docs/gpu.md, on a machine with a CUDA GPU, torch, CuPy and pynvml.
#
#   benchmarks/gpu/verify_on_gpu.sh [WHEEL_DIR] [OUT_DIR]
#
# Installs byteps (its wheels from WHEEL_DIR, pyzmq among them if the machine
# lacks it; or built from packages/) into a folder on PYTHONPATH, so the
# machine's own torch, CuPy and pynvml stay in use, then:
#   1. the CUDA tests beside the CPU ones (packages/byteps-torch/tests/test_cuda.py),
#   2. the topology read through the real NVML (recorded to OUT_DIR/nvml.json),
#   3. the 100 MB push_pull benchmark against the copy bound and NCCL,
#   4. local aggregation on the GPU against host memory (2 processes sharing the GPU, 100 MB).
# Everything it prints also goes to OUT_DIR (default ./gpu-results).
set -uo pipefail
cd "$(dirname "$0")/../.."
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
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16} "$PY" -m pip install -q --no-index --no-deps \
    --no-build-isolation --no-compile --target "$SITE" "${wheels[@]}" "${missing[@]}" || exit 3
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT_DIR/gpu.txt"
"$PY" - <<'PY' 2>&1 | tee "$OUT_DIR/topology.txt"
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
status=0
"$PY" -m pytest -v -rs -x --timeout=200 packages/byteps-torch/tests/test_cuda.py 2>&1 | tee "$OUT_DIR/test_cuda.txt" || status=1
"$PY" -m pytest -q packages/byteps-common/tests/test_device_staging.py 2>&1 | tail -3 | tee -a "$OUT_DIR/test_cuda.txt" || status=1
timeout 300 "$PY" benchmarks/gpu/bench_cuda_push_pull.py --json "$OUT_DIR/bench.json" 2>&1 \
    | tee "$OUT_DIR/bench.txt" || status=1
timeout 300 "$PY" benchmarks/gpu/bench_gpu_local_aggregation.py --json "$OUT_DIR/bench_local.json" 2>&1 \
    | tee "$OUT_DIR/bench_local.txt" || status=1
exit $status
