"""ServerEngine against numpy: rounds of one to four workers' pushes, every
dtype, one to four threads, buffers below and above the pool threshold.

Sums are compared exactly: the engine adds pushes in arrival order, one
IEEE operation per element per push, so a numpy sum in the same order is
bit-identical; halves are summed in float32 and rounded once, like the
reference below.

The engine copies no push (it holds a round's first push until the second
arrives, and with one worker the push is the result), so the lifetime
tests below watch pushed arrays through weak references.
"""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

from byteps.common import _C as kernels_C
from byteps.common.dtypes import DType
from byteps.server import _C
from byteps.server.engine import ServerEngine, create_engine

HALVES = (DType.FLOAT16, DType.BFLOAT16)
LARGE = 3 * 1024 * 1024 + 24  # bytes: a few MB, above the pool threshold, ragged last slice
assert LARGE >= _C.PARALLEL_BYTES


def bf16_from_f32(x: np.ndarray) -> np.ndarray:
    w = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((w + 0x7FFF + ((w >> 16) & 1)) >> 16) & 0xFFFF
    is_nan = (w & 0x7FFFFFFF) > 0x7F800000
    return np.where(is_nan, (w >> 16) | 0x40, rounded).astype(np.uint16)


def f32_from_bf16(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def pushes_for(dtype: DType, count: int, workers: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(workers):
        if dtype == DType.INT32:
            out.append(rng.integers(-(2**31), 2**31, count, dtype=np.int64).astype(np.int32))
        elif dtype == DType.INT64:
            out.append(rng.integers(-(2**62), 2**62, count, dtype=np.int64))
        else:
            values = (rng.standard_normal(count) * 10).astype(np.float32)
            out.append(bf16_from_f32(values) if dtype == DType.BFLOAT16 else values.astype(dtype.storage))
    return out


def reference_sum(pushes: list, dtype: DType) -> np.ndarray:
    """Sequential sum in the accumulation type, rounded once to dtype."""
    def widen(x):
        if dtype == DType.BFLOAT16:
            return f32_from_bf16(x)
        return x.astype(np.float32) if dtype == DType.FLOAT16 else x.copy()

    with np.errstate(over="ignore"):
        acc = widen(pushes[0])
        for push in pushes[1:]:
            acc += widen(push)
    if dtype == DType.BFLOAT16:
        return bf16_from_f32(acc)
    return acc.astype(dtype.storage)


def as_array(view: memoryview, dtype: DType) -> np.ndarray:
    return np.frombuffer(view, dtype=dtype.storage)


# --- rounds of pushes -----------------------------------------------------------------

@pytest.mark.parametrize("workers", [1, 2, 3, 4])
@pytest.mark.parametrize("nbytes", [8, 56, LARGE], ids=["tiny", "small", "large"])
@pytest.mark.parametrize("num_threads", [1, 2, 4])
@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_rounds_of_pushes_sum_like_numpy(dtype, num_threads, nbytes, workers):
    rounds, key = 3, 42
    count = nbytes // dtype.itemsize
    engine = create_engine(num_threads, workers)
    assert (engine.num_threads, engine.num_workers) == (num_threads, workers)
    engine.declare(key, count * dtype.itemsize, dtype)
    assert engine.completed_round(key) == -1
    sums = []
    for r in range(rounds):
        pushes = pushes_for(dtype, count, workers, seed=100 * r + count)
        done = [engine.push(key, r, push) for push in pushes]
        assert done == [False] * (workers - 1) + [True]
        assert engine.completed_round(key) == r
        sums.append(reference_sum(pushes, dtype))
        del pushes  # the engine's held pushes must not depend on the caller's references
        for done_round in range(max(0, r - 1), r + 1):  # the last two rounds stay readable
            np.testing.assert_array_equal(as_array(engine.result(key, done_round), dtype), sums[done_round])


@pytest.mark.parametrize("workers", [2, 3, 4])
@pytest.mark.parametrize("nbytes", [56, LARGE], ids=["small", "large"])
@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_pushes_flagged_zeros_are_counted_not_summed(dtype, nbytes, workers):
    """Every pattern of zeros among a round's pushes gives numpy's sum of the others (zeros alone: zeros)."""
    key, count = 5, nbytes // dtype.itemsize
    engine = create_engine(2, workers)
    engine.declare(key, count * dtype.itemsize, dtype)
    zeros = np.zeros(count, dtype.storage)
    for r in range(2 ** workers):  # round r: worker w pushes zeros where bit w of r is set
        flagged = [bool(r >> w & 1) for w in range(workers)]
        pushes = pushes_for(dtype, count, workers, seed=r)
        done = [engine.push(key, r, zeros if z else push, zeros=z) for push, z in zip(pushes, flagged)]
        assert done == [False] * (workers - 1) + [True]
        summed = [push for push, z in zip(pushes, flagged) if not z]
        if len(summed) == 1:  # the one push with bytes is the sum, bit for bit
            expected = summed[0]
        elif summed:
            expected = reference_sum(summed, dtype)
        else:
            expected = zeros
        np.testing.assert_array_equal(as_array(engine.result(key, r), dtype), expected)
        if r:  # the round before stays readable
            previous = [push for push, z in zip(pushes_for(dtype, count, workers, seed=r - 1),
                                                [bool((r - 1) >> w & 1) for w in range(workers)]) if not z]
            if len(previous) > 1:
                np.testing.assert_array_equal(as_array(engine.result(key, r - 1), dtype),
                                              reference_sum(previous, dtype))


def test_a_push_alone_among_zeros_is_held_not_copied():
    engine = create_engine(1, 3)
    engine.declare(0, 16, DType.FLOAT32)
    zeros = np.zeros(4, np.float32)
    push = np.arange(4, dtype=np.float32)
    alive = weakref.ref(push)
    engine.push(0, 0, zeros, zeros=True)
    engine.push(0, 0, push)
    assert engine.push(0, 0, zeros, zeros=True)
    view = engine.result(0, 0)
    assert np.frombuffer(view, np.float32).ctypes.data == push.ctypes.data  # the push itself
    del push, view
    gc.collect()
    assert alive() is not None  # kept for pulls until round 2 starts
    for r in (1, 2):
        for _ in range(3):
            engine.push(0, r, zeros, zeros=True)
    gc.collect()
    assert alive() is None
    np.testing.assert_array_equal(as_array(engine.result(0, 2), DType.FLOAT32), zeros)


def test_several_keys_progress_independently():
    engine = create_engine(2, 2)
    engine.declare(1, 400, DType.FLOAT32)
    engine.declare(2, 200, DType.FLOAT16)
    a = [np.full(100, float(i), np.float32) for i in range(2)]
    b = [np.full(100, float(i), np.float16) for i in range(2)]
    for push in a:
        engine.push(1, 0, push)
    engine.push(1, 1, a[0])
    assert engine.push(2, 0, b[0]) is False and engine.push(2, 0, b[1]) is True
    assert (engine.completed_round(1), engine.completed_round(2)) == (0, 0)
    np.testing.assert_array_equal(as_array(engine.result(1, 0), DType.FLOAT32), np.ones(100, np.float32))
    np.testing.assert_array_equal(as_array(engine.result(2, 0), DType.FLOAT16), np.ones(100, np.float16))


@pytest.mark.parametrize("dtype", [DType.INT32, DType.FLOAT16, DType.BFLOAT16], ids=lambda d: d.name)
def test_single_worker_round_completes_on_every_push(dtype):
    engine = create_engine(2, 1)
    engine.declare(0, LARGE, dtype)
    for r in range(4):
        (push,) = pushes_for(dtype, LARGE // dtype.itemsize, 1, seed=r)
        assert engine.push(0, r, push) is True
        np.testing.assert_array_equal(as_array(engine.result(0, r), dtype), push)


# --- pushes are held, not copied ----------------------------------------------------

@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_single_worker_result_is_the_pushed_buffer_itself(dtype):
    engine = create_engine(2, 1)
    engine.declare(0, LARGE, dtype)
    (push,) = pushes_for(dtype, LARGE // dtype.itemsize, 1, seed=3)
    assert engine.push(0, 0, push) is True
    got = as_array(engine.result(0, 0), dtype)
    assert got.ctypes.data == push.ctypes.data  # no copy, halves included
    assert not got.flags.writeable
    push[:3] = push[3:6]  # so the caller must not touch a pushed buffer while it is in use
    np.testing.assert_array_equal(got, push)


def test_single_worker_keeps_a_push_until_round_plus_2_starts():
    engine = create_engine(1, 1)
    engine.declare(0, 16, DType.FLOAT32)
    pushes = [np.full(4, r, np.float32) for r in range(4)]
    alive = [weakref.ref(p) for p in pushes]
    for r in range(2):
        engine.push(0, r, pushes[r])
    del pushes[:2]
    gc.collect()
    assert alive[0]() is not None and alive[1]() is not None
    view = engine.result(0, 0)
    engine.push(0, 2, pushes[0])  # round 2 starts: round 0's push is let go, but the view holds it
    with pytest.raises(ValueError, match="round 0 of key 0 is no longer held"):
        engine.result(0, 0)
    gc.collect()
    assert alive[0]() is not None
    np.testing.assert_array_equal(np.frombuffer(view, np.float32), [0] * 4)
    del view
    gc.collect()
    assert alive[0]() is None and alive[1]() is not None
    np.testing.assert_array_equal(as_array(engine.result(0, 1), DType.FLOAT32), [1] * 4)
    engine.push(0, 3, pushes[1])
    gc.collect()
    assert alive[1]() is None


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_held_first_push_whose_caller_dropped_it_still_sums(dtype, workers):
    engine = create_engine(2, workers)
    engine.declare(1, LARGE, dtype)
    pushes = pushes_for(dtype, LARGE // dtype.itemsize, workers, seed=8)
    want = reference_sum(pushes, dtype)
    first = weakref.ref(pushes[0])
    assert engine.push(1, 0, pushes.pop(0)) is False
    gc.collect()
    assert first() is not None  # the engine holds it, nobody else does
    for i, push in enumerate(pushes):
        assert engine.push(1, 0, push) is (i == len(pushes) - 1)
        if i == 0:
            gc.collect()
            assert first() is None  # let go once summed with the second push
    np.testing.assert_array_equal(as_array(engine.result(1, 0), dtype), want)


def test_a_refused_push_is_not_kept():
    engine = create_engine(1, 2)
    engine.declare(2, 16, DType.FLOAT32)
    wrong_size, wrong_round = np.zeros(3, np.float32), np.zeros(4, np.float32)
    refs = [weakref.ref(wrong_size), weakref.ref(wrong_round)]
    with pytest.raises(ValueError):
        engine.push(2, 0, wrong_size)
    with pytest.raises(ValueError):
        engine.push(2, 1, wrong_round)
    del wrong_size, wrong_round
    gc.collect()
    assert [ref() for ref in refs] == [None, None]


def test_result_views_keep_a_held_zmq_frame_alive_past_the_engine():
    zmq = pytest.importorskip("zmq")
    engine = create_engine(2, 1)
    engine.declare(3, LARGE, DType.FLOAT32)
    values = np.arange(LARGE // 4, dtype=np.float32)
    frame = zmq.Frame(values.tobytes())
    engine.push(3, 0, frame.buffer)  # what the server passes: a memoryview onto the frame
    view = engine.result(3, 0)
    del frame, engine
    gc.collect()
    np.testing.assert_array_equal(np.frombuffer(view, np.float32), values)


def test_first_push_may_be_a_view_of_the_buffer_its_round_sums_into():
    # Round 2 sums into round 0's buffer; a view of round 0 pushed as round
    # 2's first push is read before that buffer is written, block by block.
    engine = create_engine(2, 2)
    engine.declare(4, LARGE, DType.FLOAT32)
    ones = np.ones(LARGE // 4, np.float32)
    for r in range(2):
        engine.push(4, r, ones)
        engine.push(4, r, ones)
    engine.push(4, 2, engine.result(4, 0))
    engine.push(4, 2, ones)
    np.testing.assert_array_equal(as_array(engine.result(4, 2), DType.FLOAT32), 3 * ones)


def test_push_accepts_bytes_memoryview_and_zmq_frames():
    zmq = pytest.importorskip("zmq")
    engine = create_engine(2, 3)
    engine.declare(5, 16, DType.FLOAT32)
    values = np.arange(4, dtype=np.float32)
    engine.push(5, 0, values.tobytes())
    engine.push(5, 0, memoryview(values))
    engine.push(5, 0, zmq.Frame(values.tobytes()))
    np.testing.assert_array_equal(as_array(engine.result(5, 0), DType.FLOAT32), 3 * values)


def test_halves_keep_nan_and_inf():
    engine = create_engine(1, 2)
    engine.declare(3, 8, DType.FLOAT16)
    engine.push(3, 0, np.array([np.nan, np.inf, 60000, 1], np.float16))
    engine.push(3, 0, np.array([1, 1, 60000, np.inf], np.float16))
    got = as_array(engine.result(3, 0), DType.FLOAT16)
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == np.inf and got[3] == np.inf


def test_concurrent_callers_are_serialized():
    engine = create_engine(2, 2)
    size = 1 << 18  # float32 elements: 1 MiB, so the pool runs
    for key in range(4):
        engine.declare(key, size * 4, DType.FLOAT32)
    ones = np.ones(size, np.float32)
    errors = []

    def drive(key):
        try:
            for r in range(5):
                engine.push(key, r, ones)
                engine.push(key, r, ones)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(key,)) for key in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for key in range(4):
        assert engine.completed_round(key) == 4
        np.testing.assert_array_equal(as_array(engine.result(key, 4), DType.FLOAT32), 2 * ones)


# --- result(): double buffering and lifetime ---------------------------------------

@pytest.mark.parametrize("dtype", [DType.FLOAT32, DType.FLOAT16], ids=lambda d: d.name)
def test_last_two_rounds_are_kept(dtype):
    engine = create_engine(1, 2)
    engine.declare(9, 4 * dtype.itemsize, dtype)

    def run_round(r):
        engine.push(9, r, np.full(4, r, dtype.storage))
        engine.push(9, r, np.full(4, r, dtype.storage))

    run_round(0)
    run_round(1)
    for r in (0, 1):
        np.testing.assert_array_equal(as_array(engine.result(9, r), dtype), [2 * r] * 4)
    engine.push(9, 2, np.full(4, 2, dtype.storage))  # round 2 starts: round 0's result leaves
    with pytest.raises(ValueError, match="round 0 of key 9 is no longer held"):
        engine.result(9, 0)
    np.testing.assert_array_equal(as_array(engine.result(9, 1), dtype), [2] * 4)
    with pytest.raises(ValueError, match=r"round 2 of key 9 is not completed \(completed_round 1\)"):
        engine.result(9, 2)
    engine.push(9, 2, np.full(4, 2, dtype.storage))
    np.testing.assert_array_equal(as_array(engine.result(9, 2), dtype), [4] * 4)
    np.testing.assert_array_equal(as_array(engine.result(9, 1), dtype), [2] * 4)


@pytest.mark.parametrize("dtype", [DType.FLOAT32, DType.BFLOAT16], ids=lambda d: d.name)
def test_last_two_rounds_are_kept_with_one_worker(dtype):
    engine = create_engine(1, 1)
    engine.declare(9, 4 * dtype.itemsize, dtype)
    for r in range(2):
        assert engine.push(9, r, np.full(4, r + 1, dtype.storage)) is True
    engine.push(9, 2, np.full(4, 3, dtype.storage))
    with pytest.raises(ValueError, match="round 0 of key 9 is no longer held"):
        engine.result(9, 0)
    with pytest.raises(ValueError, match=r"round 3 of key 9 is not completed \(completed_round 2\)"):
        engine.result(9, 3)
    for r in (1, 2):
        np.testing.assert_array_equal(as_array(engine.result(9, r), dtype), np.full(4, r + 1, dtype.storage))


# --- released rounds and the sum-buffer pool ---------------------------------------------

def run_round(engine, key, round_, pushes):
    for push in pushes:
        engine.push(key, round_, push)


@pytest.mark.parametrize("dtype", [DType.FLOAT32, DType.FLOAT16], ids=lambda d: d.name)
def test_released_sums_lend_their_buffer_to_every_key(dtype):
    # 40 keys x 3 rounds, each released once read: the server holds one round's sum, not two per key.
    nbytes = 4096
    engine = create_engine(2, 2)
    for key in range(40):
        engine.declare(key, nbytes, dtype)
    assert engine.sum_bytes == 0  # declaring allocates nothing
    for r in range(3):
        for key in range(40):
            pushes = pushes_for(dtype, nbytes // dtype.itemsize, 2, seed=100 * r + key)
            run_round(engine, key, r, pushes)
            np.testing.assert_array_equal(as_array(engine.result(key, r), dtype), reference_sum(pushes, dtype))
            engine.release(key, r)
            with pytest.raises(ValueError, match=f"round {r} of key {key} is no longer held: it was released"):
                engine.result(key, r)
    wider = nbytes // dtype.itemsize * 4 if dtype in HALVES else 0  # a half's float32 accumulator
    assert engine.sum_bytes == nbytes + wider


def test_without_release_each_key_holds_its_last_two_sums():
    engine = create_engine(1, 2)
    for key in range(5):
        engine.declare(key, 64, DType.FLOAT32)
    for r in range(4):
        for key in range(5):
            run_round(engine, key, r, [np.full(16, r, np.float32)] * 2)
    assert engine.sum_bytes == 5 * 2 * 64
    np.testing.assert_array_equal(as_array(engine.result(3, 2), DType.FLOAT32), [4] * 16)


def test_a_view_keeps_a_released_sum_from_being_reused():
    engine = create_engine(1, 2)
    for key in (0, 1):
        engine.declare(key, 64, DType.FLOAT32)
    run_round(engine, 0, 0, [np.full(16, 1, np.float32)] * 2)
    view = engine.result(0, 0)  # a send still queued, say
    engine.release(0, 0)
    run_round(engine, 1, 0, [np.full(16, 5, np.float32)] * 2)  # needs a new buffer: the first is still read
    assert engine.sum_bytes == 2 * 64
    np.testing.assert_array_equal(np.frombuffer(view, np.float32), [2] * 16)
    engine.release(1, 0)
    del view
    gc.collect()
    for r in (1, 2):  # both buffers are free again: no third is allocated
        for key in (0, 1):
            run_round(engine, key, r, [np.full(16, r + key, np.float32)] * 2)
        for key in (0, 1):
            np.testing.assert_array_equal(as_array(engine.result(key, r), DType.FLOAT32), [2 * (r + key)] * 16)
            engine.release(key, r)
    assert engine.sum_bytes == 2 * 64


def test_release_lets_go_of_a_held_push_and_ignores_rounds_not_held():
    engine = create_engine(1, 1)  # one worker: the push is the result
    engine.declare(2, 16, DType.FLOAT32)
    push = np.full(4, 3, np.float32)
    alive = weakref.ref(push)
    engine.push(2, 0, push)
    del push
    gc.collect()
    assert alive() is not None
    engine.release(2, 0)
    gc.collect()
    assert alive() is None
    engine.release(2, 0)  # twice, a round never completed, a negative one: nothing to do
    engine.release(2, 5)
    engine.release(2, -1)
    with pytest.raises(ValueError, match="key 77 is not declared"):
        engine.release(77, 0)


def test_result_is_a_read_only_byte_view_that_outlives_the_engine():
    engine = create_engine(2, 1)
    engine.declare(1, 12, DType.INT32)
    engine.push(1, 0, np.array([7, 8, 9], np.int32))
    view = engine.result(1, 0)
    assert isinstance(view, memoryview)
    assert view.readonly and view.format == "B" and view.nbytes == 12 and view.ndim == 1
    with pytest.raises(TypeError):
        view[0] = 1
    del engine
    gc.collect()
    np.testing.assert_array_equal(np.frombuffer(view, np.int32), [7, 8, 9])


# --- reduce_into -----------------------------------------------------------------------

@pytest.mark.parametrize("count", [1, 7, 1000003])
@pytest.mark.parametrize("num_threads", [1, 2, 4])
@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_reduce_into_matches_numpy(dtype, num_threads, count):
    dst, src = pushes_for(dtype, count, 2, seed=count)
    want = reference_sum([dst, src], dtype)
    create_engine(num_threads, 1).reduce_into(dst, src, dtype)
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_reduce_into_matches_common_sum_into(dtype):
    dst, src = pushes_for(dtype, 300001, 2, seed=5)
    expected = dst.copy()
    kernels_C.sum_into(expected, src, dtype)
    create_engine(2, 1).reduce_into(dst, src, dtype)
    np.testing.assert_array_equal(dst, expected)


def test_reduce_into_same_buffer_doubles():
    x = (np.arange(1 << 18) % 100).astype(np.float16)
    want = (x.astype(np.float32) * 2).astype(np.float16)
    create_engine(2, 1).reduce_into(x, x, DType.FLOAT16)
    np.testing.assert_array_equal(x, want)


# --- errors --------------------------------------------------------------------------------

def test_constructor_errors():
    table = kernels_C.kernel_table()
    with pytest.raises(ValueError, match="num_threads must be in 1..1024, got 0"):
        ServerEngine(0, 1, table)
    with pytest.raises(ValueError, match="num_workers must be at least 1, got 0"):
        ServerEngine(1, 0, table)
    with pytest.raises(ValueError, match="kernel table ABI 2 is not supported.*needs kernel ABI 1"):
        ServerEngine(1, 1, dict(table, abi=2))
    with pytest.raises(ValueError, match="kernel_table has no 'finalize' entry"):
        ServerEngine(1, 1, {"abi": 1, "accumulate": table["accumulate"]})
    with pytest.raises(ValueError, match="kernel_table has no 'abi' entry"):
        ServerEngine(1, 1, {})
    with pytest.raises(ValueError, match=r"kernel_table\['accumulate'\] is null"):
        ServerEngine(1, 1, dict(table, accumulate=0))


def test_declare_errors():
    engine = create_engine(1, 2)
    engine.declare(4, 64, DType.FLOAT32)
    engine.declare(4, 64, DType.FLOAT32)  # idempotent
    with pytest.raises(ValueError, match=r"key 4 is already declared as \(nbytes=64, dtype=float32\), "
                                         r"cannot redeclare it as \(nbytes=128, dtype=float32\)"):
        engine.declare(4, 128, DType.FLOAT32)
    with pytest.raises(ValueError, match=r"\(nbytes=64, dtype=float16\)"):
        engine.declare(4, 64, DType.FLOAT16)
    with pytest.raises(ValueError, match="nbytes 0 must be a positive multiple of the float32 itemsize 4"):
        engine.declare(5, 0, DType.FLOAT32)
    with pytest.raises(ValueError, match="nbytes 12 must be a positive multiple of the int64 itemsize 8"):
        engine.declare(5, 12, DType.INT64)
    with pytest.raises(ValueError, match="unknown dtype code 6"):
        engine.declare(5, 16, 6)


def test_push_and_result_errors():
    engine = create_engine(1, 2)
    with pytest.raises(ValueError, match="key 8 is not declared"):
        engine.push(8, 0, b"\0" * 4)
    with pytest.raises(ValueError, match="key 8 is not declared"):
        engine.result(8, 0)
    with pytest.raises(ValueError, match="key 8 is not declared"):
        engine.completed_round(8)
    engine.declare(8, 16, DType.FLOAT32)
    with pytest.raises(ValueError, match="push for key 8 has 12 bytes, but the key is declared with 16 bytes"):
        engine.push(8, 0, b"\0" * 12)
    with pytest.raises(ValueError, match=r"push for key 8 round 1, but the key is accumulating round 0 "
                                         r"\(completed_round -1\)"):
        engine.push(8, 1, b"\0" * 16)
    with pytest.raises(ValueError, match=r"round 0 of key 8 is not completed \(completed_round -1\)"):
        engine.result(8, 0)
    engine.push(8, 0, b"\0" * 16)
    engine.push(8, 0, b"\0" * 16)
    with pytest.raises(ValueError, match="push for key 8 round 0, but the key is accumulating round 1"):
        engine.push(8, 0, b"\0" * 16)
    with pytest.raises(ValueError, match="round -1 of key 8 is not completed"):
        engine.result(8, -1)
    with pytest.raises(TypeError, match="data must support the buffer protocol"):
        engine.push(8, 1, [0.0] * 4)


def test_reduce_into_errors():
    engine = create_engine(2, 1)
    a = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="dst has 32 bytes and src has 28 bytes"):
        engine.reduce_into(a, np.zeros(7, np.float32), DType.FLOAT32)
    with pytest.raises(ValueError, match="multiple of the int64 itemsize 8"):
        engine.reduce_into(np.zeros(3, np.float32), np.zeros(3, np.float32), DType.INT64)
    with pytest.raises(ValueError, match=r"dst is read-only \(32 bytes\)"):
        engine.reduce_into(a.tobytes(), a, DType.FLOAT32)
    with pytest.raises(ValueError, match="unknown dtype code -1"):
        engine.reduce_into(a, a, -1)
    with pytest.raises(ValueError, match="overlap"):
        engine.reduce_into(a[2:], a[:6], DType.FLOAT32)
    with pytest.raises(ValueError, match="C-contiguous"):
        engine.reduce_into(a[:4], a[::2], DType.FLOAT32)
