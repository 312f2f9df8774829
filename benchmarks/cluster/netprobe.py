"""A raw TCP stream between two hosts of the rig: how fast can one NIC go?

``receive`` binds, accepts one sender and counts bytes for ``--seconds``
after the first byte arrives, skipping the first 0.3 s (TCP slow start and
tbf's initial burst), then writes bytes/s to ``--out``. ``send`` streams
until the receiver hangs up. The rig compares the rate with the cap, on an
idle link and with every link busy at once, to tell a capped network from
a CPU-bound one.
"""

from __future__ import annotations

import argparse
import json
import socket
import time

SKIP_S = 0.3


def receive(address: str, port: int, seconds: float, out: str) -> None:
    with socket.create_server((address, port)) as server:
        server.settimeout(30)
        conn, _ = server.accept()
    buf = bytearray(1 << 20)
    with conn:
        conn.recv_into(buf)
        begin = time.perf_counter()
        counted, start = 0, None
        while True:
            now = time.perf_counter()
            if now - begin >= SKIP_S + seconds:
                break
            got = conn.recv_into(buf)
            if not got:
                break
            if now - begin >= SKIP_S:
                if start is None:
                    start = now
                else:
                    counted += got
        elapsed = time.perf_counter() - (start or begin)
    with open(out, "w") as f:
        json.dump({"bytes_per_s": counted / elapsed if elapsed > 0 else 0.0, "seconds": elapsed}, f)


def send(address: str, port: int) -> None:
    data = memoryview(bytearray(4 << 20))
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = socket.create_connection((address, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with conn:
        try:
            while True:
                conn.sendall(data)
        except OSError:  # the receiver is done
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("send", "receive"))
    parser.add_argument("--address", required=True)
    parser.add_argument("--port", type=int, default=5999)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.mode == "receive":
        receive(args.address, args.port, args.seconds, args.out)
    else:
        send(args.address, args.port)


if __name__ == "__main__":
    main()
