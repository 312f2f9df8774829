"""Does the cap hold? Raw TCP streams on the idle rig and with every NIC busy at once.

One stream between two otherwise idle hosts shows what a single capped NIC
delivers (TCP/IP headers take ~4.5% of the cap at MTU 1500). Then every
host sends to the next and receives from the previous, all at once: if
those streams fall well below the idle one, the machine's cores, not the
caps, are what limits a cluster of this size, and the rate must come down
for the measurements to mean anything.

Example::

    report = calibrate(rig, workdir)      # {"idle_bytes_per_s": ..., "busy_min_bytes_per_s": ..., ...}
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Dict, List, Tuple

from rig import ClusterRig

__all__ = ["probe", "calibrate", "all_to_all", "CAP_HOLDS"]

HERE = os.path.dirname(os.path.abspath(__file__))
CAP_HOLDS = 0.9  # every busy stream at >= 90% of the idle one: the cap, not the CPU, is the limit


def probe(rig: ClusterRig, pairs: List[Tuple[int, int]], workdir: str, seconds: float = 2.0,
          port: int = 5999) -> List[float]:
    """Bytes/s of one TCP stream per (sender, receiver) pair, all running at once."""
    os.makedirs(workdir, exist_ok=True)
    env = dict(os.environ)
    receivers, senders, outs = [], [], []
    try:
        for i, (_, dst) in enumerate(pairs):
            outs.append(os.path.join(workdir, f"probe{i}.json"))
            receivers.append(rig.spawn(dst, [sys.executable, os.path.join(HERE, "netprobe.py"), "receive",
                                             "--address", rig.address(dst), "--port", str(port + i),
                                             "--seconds", str(seconds), "--out", outs[-1]], env))
        time.sleep(0.3)  # receivers listening
        for i, (src, dst) in enumerate(pairs):
            senders.append(rig.spawn(src, [sys.executable, os.path.join(HERE, "netprobe.py"), "send",
                                           "--address", rig.address(dst), "--port", str(port + i)], env))
        deadline = time.monotonic() + seconds + 30
        for proc in receivers:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        rig.forget(receivers + senders)
    rates = []
    for out in outs:
        with open(out) as f:
            rates.append(json.load(f)["bytes_per_s"])
    return rates


def calibrate(rig: ClusterRig, workdir: str, seconds: float = 2.0) -> Dict[str, float]:
    """Idle-link and all-links-busy stream rates against the cap."""
    cap = rig.rate_bits / 8
    idle = probe(rig, [(0, 1)], os.path.join(workdir, "idle"), seconds)[0]
    hosts = len(rig.hosts)
    busy = probe(rig, [(h, (h + 1) % hosts) for h in range(hosts)], os.path.join(workdir, "busy"), seconds)
    return {"rate": rig.rate, "cap_bytes_per_s": cap, "hosts": hosts, "idle_bytes_per_s": idle,
            "busy_min_bytes_per_s": min(busy), "busy_median_bytes_per_s": sorted(busy)[len(busy) // 2],
            "cap_holds": min(busy) >= CAP_HOLDS * idle}


def all_to_all(rig: ClusterRig, hosts: int, workdir: str, seconds: float = 4.0) -> Dict[str, List[float]]:
    """Every one of the first ``hosts`` hosts streams to every other at once (n - 1 streams per NIC each way,
    the pattern of parameter servers on the worker hosts, without its dependencies): each host's bytes/s out.

    Against the ring of :func:`calibrate` this tells whether TCP keeps every NIC busy when flows share both
    ends, apart from anything byteps does.
    """
    pairs = [(i, j) for i in range(hosts) for j in range(hosts) if i != j]
    rates = probe(rig, pairs, workdir, seconds, port=6100)
    return {"per_host_bytes_per_s": [sum(r for (src, _), r in zip(pairs, rates) if src == h) for h in range(hosts)],
            "per_stream_bytes_per_s": rates}
