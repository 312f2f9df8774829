"""Commands and the header frame of the byteps wire protocol.

A message is a ZeroMQ multipart message: one 40-byte header frame (packed
and validated by the C++ codec in ``_C``), optionally followed by one payload
frame. Control messages carry UTF-8 JSON payloads; data messages carry raw
tensor bytes. See docs/architecture.md for the layout.
"""

from __future__ import annotations

import enum
import json
from typing import Any, NamedTuple

from byteps.transport import _C

__all__ = [
    "Command",
    "Header",
    "FrameError",
    "ProtocolVersionError",
    "PROTOCOL_VERSION",
    "HEADER_BYTES",
    "FLAG_AVERAGE",
    "FLAG_SKIPPED",
    "FLAG_ZEROS",
    "FLAG_BARE",
    "FLAG_LOOKUP",
    "FLAG_PULL",
    "MAX_CONTROL_PAYLOAD",
    "command_name",
    "encode_header",
    "decode_header",
    "json_payload",
    "parse_json_payload",
]

FrameError = _C.FrameError
ProtocolVersionError = _C.ProtocolVersionError
PROTOCOL_VERSION: int = _C.PROTOCOL_VERSION
HEADER_BYTES: int = _C.HEADER_BYTES
MAX_CONTROL_PAYLOAD = 1 << 20


class Command(enum.IntEnum):
    """What a message asks for. Part of the wire protocol: never renumber."""

    REGISTER = 1  # node -> scheduler: JSON NodeInfo
    ADDRESS_BOOK = 2  # scheduler -> node: JSON address book
    BARRIER = 3  # node -> scheduler, aux = barrier group
    BARRIER_RELEASE = 4  # scheduler -> node, key = the sender whose BARRIER completed it
    FINALIZE = 5  # worker -> scheduler: this worker is done (code 6 is retired)
    TERMINATE = 7  # scheduler -> server: exit now
    ERROR = 8  # any -> any: UTF-8 text payload, key names the tensor if any
    HEARTBEAT = 9  # node -> scheduler, and the scheduler's answer
    NODE_FAILED = 10  # scheduler -> nodes: UTF-8 text naming the node presumed dead
    HELLO = 11  # node -> listener: client nonce (authentication, see authentication.py)
    CHALLENGE = 12  # listener -> node: server nonce + the listener's proof
    PROOF = 13  # node -> listener: the node's proof
    AUTH_OK = 14  # listener -> node: admitted
    INIT_KEY = 16  # worker -> server: JSON description of a partition
    PUSH = 17  # worker -> server: payload = partition bytes
    PULL = 18  # worker -> server: ask for the sum of a round
    PULL_RESPONSE = 19  # server -> worker: payload = summed partition bytes
    PUSH_ACK = 20  # server -> worker: this push arrived (frees the worker's scheduling credit)
    LOCAL_READY = 21  # local worker -> partition's local root: my input is in my shared-memory slot
    LOCAL_DONE = 22  # local root -> other local workers: the partition's sum is in my slot
    JOIN = 23  # worker -> server: this worker machine joined (hvd.join); its missing pushes count as zeros
    LOCAL_JOINED = 24  # local worker -> other local workers: joined; partitions it roots are summed as zeros
    BARRIER_ARRIVED = 25  # scheduler -> node: the BARRIER that asked (round = BARRIER_ASK_ARRIVAL) is counted


def command_name(code: int) -> str:
    """Name of a command code, or a description of an unknown one."""
    try:
        return Command(code).name
    except ValueError:
        return f"unknown command {code}"


#: Header flag of a PUSH: the worker averages this tensor (clear: it sums).
FLAG_AVERAGE = 1
#: Header flag of a PULL: the worker skipped this round (backup workers) and pulls its sum without a push.
FLAG_SKIPPED = 2
#: Header flag of a PUSH: the partition is all zeros and no payload travels (a gather's other ranks' bytes).
FLAG_ZEROS = 4
#: Header flag of a PULL: the worker already holds the round's sum (a gather's own bytes or its padding, a
#: broadcast's root): the server answers with a header alone once the round is complete.
FLAG_BARE = 8
#: Header flag of a PUSH: the push is also its sender's PULL of the same key and round (with FLAG_BARE, a bare
#: one). A pipelined worker pulls every partition right after pushing it, so one message does both; the server
#: leaves out the PUSH_ACK when it answers the pull at once (the answer frees the same credit). Protocol v3.
FLAG_PULL = 16
#: Header flag of a PULL of a server-held table's key: the payload is row ids (int64, unique, ascending) and
#: the answer their current rows, now, outside the table's rounds (a forward pass's lookup; docs/sparse.md).
#: The answer's PULL_RESPONSEs carry it too. Protocol v6.
FLAG_LOOKUP = 32


class Header(NamedTuple):
    command: int
    sender: int
    key: int
    round: int
    payload_bytes: int
    dtype: int
    flags: int
    aux: int


def encode_header(
    command: int,
    sender: int,
    key: int = 0,
    round: int = 0,
    payload_bytes: int = 0,
    dtype: int = 0,
    flags: int = 0,
    aux: int = 0,
) -> bytes:
    """Pack one header frame for the current protocol version."""
    return _C.encode(int(command), sender, key, round, payload_bytes, dtype, flags, aux)


def decode_header(frame: Any, max_payload_bytes: int) -> Header:
    """Validate and unpack a header frame; raises FrameError / ProtocolVersionError."""
    return Header._make(_C.decode(frame, max_payload_bytes))


def json_payload(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def parse_json_payload(payload: Any) -> Any:
    """Parse a JSON control payload; FrameError if it is not JSON."""
    try:
        return json.loads(bytes(payload).decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise FrameError(f"malformed control payload: {exc}") from None
