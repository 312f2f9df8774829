"""The flag byte of LOCAL_READY: what every local rank of a round must agree on, and whether it sent bytes.

Bit 0 is FLAG_AVERAGE; bits 1-6 the task's tag (0; a broadcast's root modulo
62, plus 1; 63 for a round skipped by backup workers); bit 7, LOCAL_ZEROS,
says the rank's input is zeros there and was not copied into its slot. A
layout notice's tag is 0 here (a joined rank's zeros agree with it); the
layout it announces travels in the message's JSON, compared by the root.
"""

from __future__ import annotations

from typing import Any

from byteps.common.tensor_description import describe_op, dtype_name
from byteps.transport import FLAG_AVERAGE

__all__ = ["LOCAL_ZEROS", "TAG_BITS", "SKIPPED_TAG", "local_flags", "local_tag", "describe_local"]

#: LOCAL_READY flag: this rank's input is all zeros in the partition (outside the task's ``nonzero`` bytes,
#: e.g. a gather's other ranks' rows, or a skipped round) and was not copied into its slot
LOCAL_ZEROS = 0x80
#: the flag bits that carry the task's tag
TAG_BITS = 0x7E
#: the tag of a skipped round (backup workers); broadcast roots use 1..62
SKIPPED_TAG = 63


def local_flags(task: Any) -> int:
    """The flags every local rank of ``task``'s round sends (without LOCAL_ZEROS)."""
    tag = SKIPPED_TAG if task.skipped else (task.tag - 1) % (SKIPPED_TAG - 1) + 1 if task.tag and not task.notice else 0
    return (FLAG_AVERAGE if task.average else 0) | tag << 1


def local_tag(flags: int) -> int:
    return (flags & TAG_BITS) >> 1


def describe_local(nbytes: int, dtype: int, flags: int) -> str:
    tag = local_tag(flags)
    op = "skips the round (backup workers)" if tag == SKIPPED_TAG else describe_op(bool(flags & FLAG_AVERAGE), tag)
    return f"{nbytes} bytes of {dtype_name(dtype)} ({op})"
