"""The wire-frame header codec (C++): packs and validates the 40-byte header; and a GIL-free completion wait."""

from typing import Any, Tuple

MAGIC: int
PROTOCOL_VERSION: int
HEADER_BYTES: int

class FrameError(ValueError): ...
class ProtocolVersionError(FrameError): ...

def encode(command: int, sender: int, key: int, round: int, payload_bytes: int, dtype: int = 0,
           flags: int = 0, aux: int = 0, version: int = ...) -> bytes:
    """Pack one header frame (40 bytes)."""

def decode(frame: Any, max_payload_bytes: int) -> Tuple[int, int, int, int, int, int, int, int]:
    """Validate and unpack one header frame; raises FrameError."""

def wait_for_change(memory: Any, offset: int, seen: int, spins: int) -> int:
    """Spin with the GIL released until the u64 at ``offset`` of ``memory`` differs from ``seen``, at most
    ``spins`` times; returns its value (a completion queue's count of entries produced)."""
