"""The header codec: round trips and every way a header can be wrong."""

import struct

import pytest

from byteps.transport import _C
from byteps.transport.frames import (
    HEADER_BYTES,
    PROTOCOL_VERSION,
    Command,
    FrameError,
    ProtocolVersionError,
    command_name,
    decode_header,
    encode_header,
)

LIMIT = 1 << 30


def test_round_trip_keeps_every_field():
    frame = encode_header(Command.PUSH, sender=7, key=(3 << 16) | 2, round=41, payload_bytes=4096000,
                          dtype=2, flags=1, aux=99)
    assert len(frame) == HEADER_BYTES == 40
    header = decode_header(frame, LIMIT)
    assert header == (Command.PUSH, 7, (3 << 16) | 2, 41, 4096000, 2, 1, 99)


def test_extreme_values_survive():
    frame = encode_header(Command.PULL, sender=-1, key=2**64 - 1, round=2**32 - 1, payload_bytes=0)
    header = decode_header(frame, LIMIT)
    assert (header.sender, header.key, header.round) == (-1, 2**64 - 1, 2**32 - 1)


@pytest.mark.parametrize("cut", [0, 3, 5, 39])
def test_truncated_header_is_refused(cut):
    frame = encode_header(Command.PUSH, 0, payload_bytes=8)
    with pytest.raises(FrameError, match="truncated|malformed"):
        decode_header(frame[:cut], LIMIT)


def test_overlong_header_is_refused():
    with pytest.raises(FrameError, match="malformed header: 41 bytes"):
        decode_header(encode_header(Command.PUSH, 0) + b"x", LIMIT)


def test_foreign_magic_is_refused():
    frame = b"HTTP" + encode_header(Command.PUSH, 0)[4:]
    with pytest.raises(FrameError, match="bad magic .* not speaking the byteps protocol"):
        decode_header(frame, LIMIT)


def test_other_protocol_version_names_both_versions():
    frame = _C.encode(int(Command.REGISTER), 0, 0, 0, 0, 0, 0, 0, version=PROTOCOL_VERSION + 1)
    with pytest.raises(ProtocolVersionError) as info:
        decode_header(frame, LIMIT)
    message = str(info.value)
    assert f"v{PROTOCOL_VERSION + 1}" in message and f"v{PROTOCOL_VERSION}" in message
    assert isinstance(info.value, FrameError) and isinstance(info.value, ValueError)


def test_lying_payload_size_is_refused_before_allocation():
    frame = encode_header(Command.PUSH, 0, payload_bytes=2**63)
    with pytest.raises(FrameError, match="oversized payload"):
        decode_header(frame, LIMIT)


def test_nonzero_reserved_field_is_refused():
    frame = bytearray(encode_header(Command.PUSH, 0))
    struct.pack_into("<H", frame, 34, 1)
    with pytest.raises(FrameError, match="reserved"):
        decode_header(bytes(frame), LIMIT)


def test_layout_is_little_endian_and_stable():
    frame = encode_header(Command.PULL_RESPONSE, sender=2, key=5, round=6, payload_bytes=7, dtype=3)
    magic, version, command, sender, round_, key, nbytes, dtype = struct.unpack_from("<IHHiIQQB", frame)
    assert frame[:4] == b"BPS1"
    assert (version, command, sender, round_, key, nbytes, dtype) == (PROTOCOL_VERSION, 19, 2, 6, 5, 7, 3)


def test_command_names():
    assert command_name(Command.PUSH) == "PUSH"
    assert command_name(999) == "unknown command 999"
