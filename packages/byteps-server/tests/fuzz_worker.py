"""Worker 1 of the fuzz job: throws generated malformed frames at every live server, then trains honestly.

Usage: python fuzz_worker.py FRAMES ROUNDS
Both workers run a first healthy round, so the healthy keys are declared;
then worker 0 goes on with the healthy rounds, its second push_pull in
flight while this process pushes and pulls the healthy keys from a stranger's
connection (refused to the stranger alone: it never declared them) and fuzzes.
After the fuzzing, this process rejoins the healthy rounds and both check the
sums against numpy. Frames are generated
by hypothesis: headers with every field drawn (unknown commands, other
protocol versions, lying payload sizes, keys, rounds, dtypes), raw and
truncated bytes, extra frames, and INIT_KEY descriptions of every kind. Fuzz
keys are tensor ids >= 1000, apart from the healthy tensors (INIT_KEY of a
healthy key with another description would, rightly, fail the healthy
workers: keeping strangers out is the job secret's task). For the same
reason no frame is a JOIN (a stranger's JOIN would, rightly, count one
worker machine as joined, hvd.join, and its pushes as zeros), and ERROR
frames, which fail the round they name on every worker (a local mismatch
reported by a machine), name fuzz keys only.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import zmq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import byteps.common as bps
from byteps.common.api import worker
from byteps.transport import _C
from byteps.transport.frames import PROTOCOL_VERSION, Command

HEALTHY = [("dense", 5000), ("small", 3)]
FUZZ_KEYS = st.builds(lambda t, p: (t << 16) | p, st.integers(1000, 1015), st.integers(0, 3))
COMMANDS = st.one_of(st.sampled_from([int(c) for c in Command if c != Command.JOIN]),
                     st.integers(0, 65535).filter(lambda code: code != Command.JOIN))

spec_values = st.fixed_dictionaries({
    "name": st.one_of(st.text(max_size=8), st.integers()),
    "partition": st.one_of(st.integers(-2, 5), st.none()),
    "shape": st.one_of(st.lists(st.integers(-1, 64), max_size=3), st.text(max_size=3)),
    "tensor_nbytes": st.integers(-8, 1 << 40),
    "nbytes": st.one_of(st.integers(-8, 4096), st.integers(1 << 20, 1 << 40)),
    "dtype": st.integers(-1, 8),
}, optional={"extra": st.integers()})


@st.composite
def messages(draw):
    """One multipart message of a fuzzed kind."""
    kind = draw(st.integers(0, 5))
    payload = draw(st.binary(max_size=64))
    if kind == 0:  # INIT_KEY with a generated description
        body = json.dumps(draw(spec_values)).encode()
        return [_C.encode(int(Command.INIT_KEY), 1, draw(FUZZ_KEYS), 0, len(body)), body]
    if kind == 1:  # raw bytes, no header at all
        return [draw(st.binary(max_size=80))] + ([payload] if draw(st.booleans()) else [])
    command = draw(COMMANDS)
    keys = FUZZ_KEYS if command == Command.ERROR else st.one_of(FUZZ_KEYS, st.integers(0, 2**64 - 1))
    header = _C.encode(
        command, draw(st.integers(-2**31, 2**31 - 1)), draw(keys),
        draw(st.integers(0, 2**32 - 1)),
        draw(st.one_of(st.just(len(payload)), st.integers(0, 2**64 - 1))),
        draw(st.integers(0, 255)), draw(st.integers(0, 255)), draw(st.integers(0, 2**32 - 1)),
        version=draw(st.one_of(st.just(PROTOCOL_VERSION), st.integers(0, 65535))))
    if kind == 2:  # truncated or overlong header
        cut = draw(st.integers(0, 45))
        header = header[:cut] if cut < 40 else header + bytes(cut - 40)
    frames = [header] + ([payload] if kind != 3 or payload else [])
    if kind == 4:  # more frames than the protocol allows
        frames += [payload] * draw(st.integers(1, 3))
    return frames


def fuzz(addresses: list, frames_wanted: int) -> int:
    context = zmq.Context()
    sockets = []
    for address in addresses:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        sockets.append(sock)
    sent = [0]
    per_example = 10

    @settings(max_examples=frames_wanted // per_example + 1, deadline=None, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(st.lists(messages(), min_size=per_example, max_size=per_example), st.integers(0, len(sockets) - 1))
    def throw(batch, which):
        sock = sockets[which]
        for frames in batch:
            sock.send_multipart(frames)
            sent[0] += len(frames)
        while sock.poll(0):  # answers (ERRORs) are read and dropped
            sock.recv_multipart()

    throw()
    for sock in sockets:
        sock.close()
    context.term()
    return sent[0]


def stranger_pushes(addresses: list) -> int:
    """PUSH and PULL of the healthy keys (tensor ids 0-3, partitions 0-7, rounds 0-3) from a connection that never
    declared them; the server must refuse them to this connection and let the healthy rounds go on."""
    context = zmq.Context()
    sent = 0
    for address in addresses:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        for tensor_id in range(4):
            for partition in range(8):
                for round_ in range(4):
                    key = (tensor_id << 16) | partition
                    payload = bytes(64)
                    sock.send_multipart([_C.encode(int(Command.PUSH), 1, key, round_, len(payload)), payload])
                    sock.send_multipart([_C.encode(int(Command.PULL), 1, key, round_, 0)])
                    sent += 2
        refusals = 0
        while refusals < 4 * 8 * 4 * 2 and sock.poll(5000):  # every frame is answered by an ERROR
            sock.recv_multipart()
            refusals += 1
        if refusals < 4 * 8 * 4 * 2:
            print(f"only {refusals} of the stranger's frames were refused by {address}", flush=True)
            sys.exit(1)
        sock.close()
    context.term()
    return sent


def healthy_rounds(first: int, last: int) -> None:
    rank, size = bps.rank(), bps.size()
    for round_ in range(first, last):
        for name, count in HEALTHY:
            data = np.arange(count, dtype=np.float32) * (rank + 1) + round_
            bps.push_pull(data, name=name, average=False)
            expected = np.arange(count, dtype=np.float32) * sum(r + 1 for r in range(size)) + size * round_
            if not np.array_equal(data, expected):
                print(f"WRONG SUM rank {rank} tensor {name} round {round_}", flush=True)
                sys.exit(1)


def main() -> None:
    frames_wanted, rounds = int(sys.argv[1]), int(sys.argv[2])
    bps.init()
    healthy_rounds(0, 1)
    if bps.rank() == 1:
        addresses = worker().server_addresses
        print(f"stranger sent {stranger_pushes(addresses)} pushes and pulls of the healthy keys", flush=True)
        sent = fuzz(addresses, frames_wanted)
        print(f"fuzzed {sent} frames at {len(addresses)} server(s)", flush=True)
    healthy_rounds(1, rounds)
    print(f"rank {bps.rank()}: {rounds} healthy rounds OK", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
