"""collectives.end_to_end: an allgather's parts that already lie end to end come back as one view, not a copy."""

import numpy as np

from byteps.common.frontend.collectives import end_to_end


def _buffer_and_raw(words: int):
    buffer = np.arange(words, dtype=np.int32)
    return buffer, buffer.view(np.uint8)


def test_adjacent_parts_are_one_view_of_the_buffer():
    buffer, raw = _buffer_and_raw(16)
    parts = [raw[0:12], raw[12:12], raw[12:40]]
    joined = end_to_end(parts)
    assert joined.nbytes == 40
    assert np.shares_memory(joined, buffer)
    assert np.array_equal(joined, raw[:40])


def test_a_gap_between_parts_makes_a_copy():
    buffer, raw = _buffer_and_raw(16)
    parts = [raw[0:6], raw[8:14]]  # sizes that are not multiples of 4 leave padding between the parts
    joined = end_to_end(parts)
    assert not np.shares_memory(joined, buffer)
    assert np.array_equal(joined, np.concatenate([raw[0:6], raw[8:14]]))


def test_parts_of_different_buffers_or_out_of_order_make_a_copy():
    _, first = _buffer_and_raw(4)
    _, second = _buffer_and_raw(4)
    assert np.array_equal(end_to_end([first[0:8], second[0:8]]), np.concatenate([first[0:8], second[0:8]]))
    buffer, raw = _buffer_and_raw(4)
    swapped = end_to_end([raw[8:16], raw[0:8]])
    assert not np.shares_memory(swapped, buffer)
    assert np.array_equal(swapped, np.concatenate([raw[8:16], raw[0:8]]))


def test_strided_parts_make_a_copy():
    buffer, raw = _buffer_and_raw(8)
    every_other = raw[0:16:2]  # 8 bytes at offsets 0, 2, ..., 14, though 8 bytes "end" at offset 8
    joined = end_to_end([every_other, raw[8:16]])
    assert not np.shares_memory(joined, buffer)
    assert np.array_equal(joined, np.concatenate([every_other, raw[8:16]]))


def test_no_parts_is_empty():
    assert end_to_end([]).nbytes == 0
