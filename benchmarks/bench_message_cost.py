"""What one message costs the thread that sends or receives it, against raw pyzmq.

A byteps message is a header frame (encoded by the C++ frame codec) and a
payload frame. This sends ``--messages`` of them from a connection to a
listener in this process over loopback TCP and times the sending and the
receiving thread's side separately, each against raw pyzmq moving the same
frames between a DEALER and a ROUTER in the same run:
``send_multipart(copy=False)`` and ``recv_multipart(copy=False)``, the
calls a pyzmq program would write (the byteps receive also copies the
payload into a buffer, as a worker receives a sum). The payload is small
(4000 bytes by default) so that the per-message path, not the bytes, is
what is timed.

    python benchmarks/bench_message_cost.py [--messages 50000] [--payload-bytes 4000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import zmq

from byteps.transport import HEADER_BYTES, Command, Context


def _time(action, count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        action()
    return (time.perf_counter() - started) / count * 1e6


def byteps_costs(context: Context, payload: np.ndarray, count: int) -> tuple:
    """(µs per send, µs per receive) through a byteps connection and listener."""
    listener = context.listen("tcp://127.0.0.1:0")
    connection = context.connect(listener.address)
    try:
        send = lambda: connection.send(Command.PUSH, 0, 7, 1, payload=payload, dtype=0)  # noqa: E731
        target = np.empty_like(payload)
        receive = lambda: listener.recv(lambda header: target)  # noqa: E731
        send_us = _time(send, count)
        receive_us = _time(receive, count)
        return send_us, receive_us
    finally:
        connection.close(0)
        listener.close(0)


def raw_costs(context: zmq.Context, payload: np.ndarray, count: int) -> tuple:
    """(µs per send, µs per receive) of the same frames with pyzmq's multipart calls."""
    router = context.socket(zmq.ROUTER)
    dealer = context.socket(zmq.DEALER)
    for socket in (router, dealer):
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    header = bytes(HEADER_BYTES)
    try:
        send_us = _time(lambda: dealer.send_multipart([header, payload], copy=False), count)
        receive_us = _time(lambda: router.recv_multipart(copy=False), count)
        return send_us, receive_us
    finally:
        dealer.close(0)
        router.close(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50000)
    parser.add_argument("--payload-bytes", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    payload = np.ones(args.payload_bytes, dtype=np.uint8)
    context = Context()
    runs = {"byteps": [], "raw": []}
    for _ in range(args.repeats):  # alternating, so drift on a shared machine hits both alike
        runs["byteps"].append(byteps_costs(context, payload, args.messages))
        runs["raw"].append(raw_costs(context.zmq, payload, args.messages))
    context.close()
    print(f"{args.messages} messages of {args.payload_bytes} payload bytes, median of {args.repeats}, "
          "loopback TCP, one process")
    print("| side | raw pyzmq (µs/message) | byteps endpoint (µs/message) | byteps / raw |")
    print("|---|---:|---:|---:|")
    for index, side in enumerate(("send", "receive")):
        raw = statistics.median(run[index] for run in runs["raw"])
        ours = statistics.median(run[index] for run in runs["byteps"])
        print(f"| {side} | {raw:.2f} | {ours:.2f} | {ours / raw:.2f} |")


if __name__ == "__main__":
    main()
