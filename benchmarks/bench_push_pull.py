"""push_pull of one large tensor, 1 worker + 1 server on loopback, against raw pyzmq.

Effective bandwidth = (bytes pushed + bytes pulled) / time of one push_pull.
The baseline, measured in the same run on the same machine, is a raw pyzmq
PUSH/PULL stream of the same number of bytes in messages of the same size
(BYTEPS_PARTITION_BYTES), zero-copy, between two processes: the most a
single TCP connection pair moves here with no byteps in the way. Goal: a
ratio of at least 0.7.

Small partitions (``--partition-bytes 4096``) take the bytes out of the
picture and show what the per-partition path costs: the line then also
gives partitions per second in each direction (a round pushes and pulls
each partition once), next to a second baseline: a bare pyzmq server loop
that polls once per message and answers each request, fed every request
at once by a client in this process (the shape of the per-partition path
with nothing of byteps in it).

    python benchmarks/bench_push_pull.py [--mb 100] [--repeats 5] [--partition-bytes N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np
import zmq
from loopback_job import free_port, one_worker_job

from byteps.common.config import Config
from byteps.transport import HEADER_BYTES

PARTITION_BYTES = Config.from_env({}).partition_bytes  # the default, as users run it

RECEIVER = r"""
import sys, zmq
ctx = zmq.Context()
data = ctx.socket(zmq.PULL); data.bind(f"tcp://127.0.0.1:{sys.argv[1]}")
ack = ctx.socket(zmq.PUSH); ack.bind(f"tcp://127.0.0.1:{sys.argv[2]}")
messages, rounds = int(sys.argv[3]), int(sys.argv[4])
for _ in range(rounds):
    for _ in range(messages):
        data.recv(copy=False)
    ack.send(b"done")
"""

ECHO_SERVER = r"""
import sys, zmq
ctx = zmq.Context()
listener = ctx.socket(zmq.ROUTER); listener.bind(f"tcp://127.0.0.1:{sys.argv[1]}")
listener.setsockopt(zmq.SNDHWM, 0); listener.setsockopt(zmq.RCVHWM, 0)
poller = zmq.Poller(); poller.register(listener, zmq.POLLIN)
for _ in range(int(sys.argv[2])):
    poller.poll()  # one poll per message, as a server loop that also watches other sockets
    identity, header, payload = listener.recv_multipart(copy=False)
    listener.send_multipart([identity, header, payload], copy=False)
"""


def _stop(process: subprocess.Popen) -> None:
    """Wait for a baseline's helper process to finish its rounds; kill it if it does not (a round failed)."""
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


def raw_zmq_echo(messages: int, message_bytes: int, repeats: int) -> list:
    """Seconds for ``messages`` request/answer pairs through a bare pyzmq server loop, per repeat.

    The server polls once per message and answers each with a message of the
    same size, the shape of byteps' per-partition path with nothing of
    byteps in it; the client sends every request at once, then receives
    the answers.
    """
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, str(port), str(messages * (repeats + 1))])
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.SNDHWM, 0)
    dealer.setsockopt(zmq.RCVHWM, 0)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    header, payload = bytes(HEADER_BYTES), np.ones(message_bytes, dtype=np.uint8)
    times = []
    try:
        for _ in range(repeats + 1):  # the first round warms up
            start = time.perf_counter()
            for _ in range(messages):
                dealer.send_multipart([header, payload], copy=False)
            for _ in range(messages):
                dealer.recv_multipart(copy=False)
            times.append(time.perf_counter() - start)
    finally:
        dealer.close(0)
        ctx.term()
        _stop(server)
    return times[1:]


def raw_zmq_stream(total_bytes: int, message_bytes: int, repeats: int) -> list:
    """Seconds to stream ``total_bytes`` to another process, per repeat."""
    data_port, ack_port = free_port(), free_port()
    chunks = [np.ones(min(message_bytes, total_bytes - off), dtype=np.uint8)
              for off in range(0, total_bytes, message_bytes)]
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, str(data_port), str(ack_port),
                                 str(len(chunks)), str(repeats + 1)])
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{data_port}")
    ack = ctx.socket(zmq.PULL)
    ack.connect(f"tcp://127.0.0.1:{ack_port}")
    times = []
    try:
        for _ in range(repeats + 1):  # the first round warms up
            start = time.perf_counter()
            for chunk in chunks:
                push.send(chunk, copy=False)
            ack.recv()
            times.append(time.perf_counter() - start)
    finally:
        push.close(0)
        ack.close(0)
        ctx.term()
        _stop(receiver)
    return times[1:]


def byteps_push_pull(nbytes: int, repeats: int, partition_bytes: int) -> list:
    """Seconds per push_pull of one float32 tensor of ``nbytes`` through a real server."""
    with one_worker_job(partition_bytes):
        import byteps.common as bps

        bps.init()
        tensor = np.ones(nbytes // 4, dtype=np.float32)
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            bps.push_pull(tensor, name="tensor", average=False)
            times.append(time.perf_counter() - start)
        assert tensor[0] == 1.0  # one worker: the sum is the input
        bps.shutdown()
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--partition-bytes", type=int, default=PARTITION_BYTES,
                        help=f"BYTEPS_PARTITION_BYTES, also the raw stream's message size (default {PARTITION_BYTES})")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    nbytes = args.mb * 1000 * 1000
    moved = 2 * nbytes  # pushed + pulled
    raw = statistics.median(raw_zmq_stream(moved, args.partition_bytes, args.repeats))
    bps_times = byteps_push_pull(nbytes, args.repeats, args.partition_bytes)
    ours = statistics.median(bps_times)
    partitions = -(-nbytes // args.partition_bytes)
    echo = statistics.median(raw_zmq_echo(partitions, args.partition_bytes, args.repeats))
    figures = {
        "tensor_mb": args.mb, "partition_bytes": args.partition_bytes, "partitions": partitions,
        "partitions_per_s": partitions / ours, "raw_messages_per_s": 2 * partitions / raw,
        "raw_echo_per_s": partitions / echo,
        "raw_pyzmq_gbps": moved / raw / 1e9, "byteps_gbps": moved / ours / 1e9,
        "byteps_seconds_median": ours, "byteps_seconds_min": min(bps_times), "byteps_seconds_max": max(bps_times),
        "ratio": raw / ours,
    }
    print(f"| what | GB/s (pushed + pulled) | ratio |\n|---|---|---|\n"
          f"| raw pyzmq PUSH/PULL stream, {moved / 1e6:.0f} MB | {figures['raw_pyzmq_gbps']:.2f} | 1.00 |\n"
          f"| byteps push_pull, {args.mb} MB float32, 1 worker + 1 server | {figures['byteps_gbps']:.2f} | "
          f"{figures['ratio']:.2f} |\n\n{partitions} partitions of {args.partition_bytes} bytes: "
          f"{figures['partitions_per_s']:.0f} pushed and pulled per second; the raw stream sends "
          f"{figures['raw_messages_per_s']:.0f} messages per second; a bare pyzmq server loop (one poll per "
          f"message) answers {figures['raw_echo_per_s']:.0f} per second")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)


if __name__ == "__main__":
    main()
