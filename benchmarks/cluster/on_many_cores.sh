#!/usr/bin/env bash
# The cluster benchmark on a machine with more cores than the 2 of the development machine, as root.
#
#   OUT_DIR=results benchmarks/cluster/on_many_cores.sh [ARGS for run_cluster_bench.py, each run]...
#
# Each argument is one run's options, as one shell word; the default runs co-located and dedicated servers
# against gloo at n = 4 and n = 8, 100 MB. The byteps packages are built from packages/ into a folder on
# PYTHONPATH with the machine's own scikit-build-core and pybind11 (no download), beside wheels in .whl/
# (pyzmq where the machine lacks it). Tools the rig needs that the machine lacks (ip, tc) may travel in
# .deb/bin with their libraries in .deb/lib. Before any run it prints what the kernel offers the rig
# (network namespaces, veth, bridge, tbf) and, for docs/rdma.md, whether an RDMA device or rdma_rxe exists.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT_DIR=${OUT_DIR:-cluster-results}
mkdir -p "$OUT_DIR"
SITE=${SITE:-/tmp/byteps-site}
[ -d .deb/bin ] && ! command -v tc >/dev/null && export PATH="$PWD/.deb/bin:$PATH" LD_LIBRARY_PATH="$PWD/.deb/lib"
{
    echo "cores: $(nproc); kernel: $(uname -r); python: $(python3 -V 2>&1)"
    echo "ip: $(command -v ip) tc: $(command -v tc)"
    echo "rdma devices: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')"
    echo "rdma_rxe: $(modprobe -n rdma_rxe 2>&1 || true) $(ls /lib/modules 2>&1 | head -1)"
    ip netns add bpsprobe && ip -n bpsprobe link add vprobe0 type veth peer name vprobe1 && \
        ip -n bpsprobe link add brprobe type bridge && ip -n bpsprobe link set vprobe0 up && \
        tc -n bpsprobe qdisc add dev vprobe0 root tbf rate 500mbit burst 256kb latency 100ms && echo "rig: ok"
    ip netns del bpsprobe 2>/dev/null
} 2>&1 | tee "$OUT_DIR/machine.txt"
wheels=()
compgen -G ".whl/*.whl" >/dev/null && wheels=(.whl/*.whl)
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install -q --no-index --no-deps --no-build-isolation \
    --no-compile --target "$SITE" "${wheels[@]}" packages/byteps-transport packages/byteps-common \
    packages/byteps-server packages/byteps-launcher packages/byteps-torch || exit 3
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
[ $# -gt 0 ] || set -- "--workers 4,8 --workloads 100MB --no-e2e --systems gloo,byteps-colocated,byteps"
status=0 i=0
for run in "$@"; do
    i=$((i + 1))
    eval "python3 benchmarks/cluster/run_cluster_bench.py --trace-n 0 --no-doc --results $OUT_DIR/run$i.json \
        --workdir /tmp/cluster-run$i $run" 2>&1 | tee "$OUT_DIR/run$i.txt" || status=1
done
exit $status
