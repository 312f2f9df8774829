"""The reduction kernels against numpy references, on both instruction sets.

Every test runs once with the AVX2/F16C loops (where the CPU has them) and
once with the portable loops, so the fallback is exercised on this machine
too. bfloat16 has no numpy dtype: its reference is an explicit
round-to-nearest-even on float32 bits, below.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from byteps.common import _C, kernels
from byteps.common.dtypes import DType

ALL = list(DType)
FLOATS = [DType.FLOAT32, DType.FLOAT64]
HALVES = [DType.FLOAT16, DType.BFLOAT16]
INTS = [DType.INT32, DType.INT64]
LENGTHS = [1, 7, 1000003]

ISAS = ["portable"] + (["avx2+f16c"] if _C.cpu_features()["avx2"] and _C.cpu_features()["f16c"] else [])


@pytest.fixture(params=ISAS, autouse=True)
def isa(request):
    previous = _C._set_isa(request.param)
    assert _C.cpu_features()["isa"] == request.param
    yield request.param
    _C._set_isa(previous)


# --- bfloat16 reference ------------------------------------------------------

def bf16_from_f32(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even, NaN kept quiet NaN."""
    w = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((w + 0x7FFF + ((w >> 16) & 1)) >> 16) & 0xFFFF
    is_nan = (w & 0x7FFFFFFF) > 0x7F800000
    return np.where(is_nan, (w >> 16) | 0x40, rounded).astype(np.uint16)


def f32_from_bf16(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def test_bf16_reference_rounds_ties_to_even():
    # 1 + 2^-8 lies halfway between bfloat16 1.0 and 1 + 2^-7: even is 1.0.
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.4e38, np.inf, -np.inf, np.nan],
                 dtype=np.float32)
    got = f32_from_bf16(bf16_from_f32(x))
    np.testing.assert_array_equal(got[:3], np.array([1.0, 1 + 2**-6, -1.0], np.float32))
    assert got[3] == np.inf and got[4] == np.inf and got[5] == -np.inf and np.isnan(got[6])


# --- data ----------------------------------------------------------------------

def random_values(dtype: DType, n: int, seed: int) -> np.ndarray:
    """n random elements of dtype in its storage type (uint16 bits for bfloat16)."""
    rng = np.random.default_rng(seed)
    if dtype == DType.INT32:
        return rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)
    if dtype == DType.INT64:
        return rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    values = rng.standard_normal(n) * 100
    if dtype == DType.BFLOAT16:
        return bf16_from_f32(values.astype(np.float32))
    return values.astype(dtype.storage)


def widen(x: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype == DType.BFLOAT16:
        return f32_from_bf16(x)
    if dtype == DType.FLOAT16:
        return x.astype(np.float32)
    return x


def narrow(acc: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype == DType.BFLOAT16:
        return bf16_from_f32(acc)
    return acc.astype(dtype.storage)


def assert_same(got: np.ndarray, want: np.ndarray, dtype: DType) -> None:
    """Bit-exact, except that any NaN matches any NaN."""
    if dtype in HALVES:
        got_f, want_f = widen(got, dtype), widen(want, dtype)
        nan = np.isnan(want_f)
        np.testing.assert_array_equal(np.isnan(got_f), nan)
        np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    else:
        np.testing.assert_array_equal(got, want)


# --- accumulate / finalize ------------------------------------------------------

@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_accumulate_three_pushes_then_finalize(dtype, n):
    pushes = [random_values(dtype, n, seed) for seed in range(3)]
    acc = kernels.empty_accumulator(n, dtype)
    assert acc.itemsize == _C.accumulation_itemsize(dtype)
    for i, push in enumerate(pushes):
        _C.accumulate(acc, push, dtype, i == 0)
    with np.errstate(over="ignore"):
        want_acc = widen(pushes[0], dtype) + widen(pushes[1], dtype) + widen(pushes[2], dtype)
    np.testing.assert_array_equal(acc, want_acc)

    out = np.empty(n, dtype=dtype.storage)
    _C.finalize(out, acc, dtype)
    assert_same(out, narrow(want_acc, dtype), dtype)


@pytest.mark.parametrize("dtype", [DType.FLOAT32, DType.FLOAT64, DType.INT32, DType.INT64],
                         ids=lambda d: d.name)
def test_finalize_in_place_is_a_no_op_and_copy_otherwise(dtype):
    acc = random_values(dtype, 1001, 3)
    before = acc.copy()
    _C.finalize(acc, acc, dtype)
    np.testing.assert_array_equal(acc, before)
    out = np.zeros_like(acc)
    _C.finalize(out, acc, dtype)
    np.testing.assert_array_equal(out, before)


def test_finalize_float16_matches_numpy_on_random_float32_bit_patterns():
    bits = np.random.default_rng(7).integers(0, 2**32, 1000003, dtype=np.uint64).astype(np.uint32)
    acc = bits.view(np.float32)
    out = np.empty(acc.size, np.float16)
    _C.finalize(out, acc, DType.FLOAT16)
    with np.errstate(over="ignore", invalid="ignore"):
        assert_same(out, acc.astype(np.float16), DType.FLOAT16)


def test_finalize_bfloat16_matches_reference_on_random_float32_bit_patterns():
    bits = np.random.default_rng(8).integers(0, 2**32, 1000003, dtype=np.uint64).astype(np.uint32)
    acc = bits.view(np.float32)
    out = np.empty(acc.size, np.uint16)
    _C.finalize(out, acc, DType.BFLOAT16)
    np.testing.assert_array_equal(out, bf16_from_f32(acc))


@pytest.mark.parametrize("dtype", HALVES, ids=lambda d: d.name)
def test_every_half_bit_pattern_widens_exactly_and_round_trips(dtype):
    bits = np.arange(2**16, dtype=np.uint16)
    acc = np.empty(bits.size, np.float32)
    _C.accumulate(acc, bits, dtype, True)
    want = bits.view(np.float16).astype(np.float32) if dtype == DType.FLOAT16 else f32_from_bf16(bits)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(acc), nan)
    np.testing.assert_array_equal(acc[~nan], want[~nan])
    back = np.empty(bits.size, dtype.storage)
    _C.finalize(back, acc, dtype)
    np.testing.assert_array_equal(back.view(np.uint16)[~nan], bits[~nan])
    assert np.isnan(widen(back[nan], dtype)).all()


def test_float16_rounding_ties_subnormals_and_overflow():
    acc = np.array([
        1 + 2**-11,          # tie between 1 and 1 + 2^-10: even is 1
        1 + 3 * 2**-11,      # tie: even is 1 + 2^-9
        2**-25,              # tie between 0 and the smallest subnormal: 0
        3 * 2**-25,          # tie: even is 2 * 2^-24
        65519.0,             # below the overflow threshold: 65504
        65520.0,             # the tie at the threshold goes to Inf
        -1e6, np.inf, -np.inf, np.nan, -0.0,
    ], dtype=np.float32)
    out = np.empty(acc.size, np.float16)
    _C.finalize(out, acc, DType.FLOAT16)
    want = np.array([1.0, 1 + 2**-9, 0.0, 2**-23, 65504.0, np.inf, -np.inf, np.inf, -np.inf,
                     np.nan, -0.0], dtype=np.float16)
    assert_same(out, want, DType.FLOAT16)
    assert out.view(np.uint16)[-1] == 0x8000  # the sign of zero survives


# --- sum_into ------------------------------------------------------------------------

@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_sum_into(dtype, n):
    dst, src = random_values(dtype, n, 10), random_values(dtype, n, 11)
    with np.errstate(over="ignore"):
        want = narrow(widen(dst, dtype) + widen(src, dtype), dtype)
    _C.sum_into(dst, src, dtype)
    assert_same(dst, want, dtype)


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_sum_into_same_buffer_doubles(dtype):
    x = random_values(dtype, 1003, 12)
    with np.errstate(over="ignore"):
        want = narrow(widen(x, dtype) + widen(x, dtype), dtype)
    _C.sum_into(x, x, dtype)
    assert_same(x, want, dtype)


@pytest.mark.parametrize("dtype", HALVES, ids=lambda d: d.name)
def test_sum_into_halves_keeps_nan_and_inf(dtype):
    a = narrow(np.array([np.nan, np.inf, np.inf, -np.inf, 1.0, 3.0e38 if dtype == DType.BFLOAT16
                         else 65504.0] * 5, np.float32), dtype)
    b = narrow(np.array([1.0, 1.0, -np.inf, -1.0, np.nan, 3.0e38 if dtype == DType.BFLOAT16
                         else 65504.0] * 5, np.float32), dtype)
    _C.sum_into(a, b, dtype)
    got = widen(a, dtype)[:6]
    assert np.isnan(got[0]) and got[1] == np.inf and np.isnan(got[2])
    assert got[3] == -np.inf and np.isnan(got[4]) and got[5] == np.inf


@pytest.mark.parametrize("dtype", HALVES, ids=lambda d: d.name)
def test_sum_into_halves_on_random_bit_patterns(dtype):
    # Every class of value: subnormals, Inf, NaN with payloads, both zeros.
    rng = np.random.default_rng(30)
    dst = rng.integers(0, 2**16, 100003, dtype=np.uint16)
    src = rng.integers(0, 2**16, 100003, dtype=np.uint16)
    if dtype == DType.FLOAT16:
        dst, src = dst.view(np.float16), src.view(np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        want = narrow(widen(dst, dtype) + widen(src, dtype), dtype)
    _C.sum_into(dst, src, dtype)
    assert_same(dst, want, dtype)


def test_integer_sum_wraps_like_numpy():
    a = np.array([2**31 - 1, -(2**31)], np.int32)
    b = np.array([1, -1], np.int32)
    _C.sum_into(a, b, DType.INT32)
    np.testing.assert_array_equal(a, [-(2**31), 2**31 - 1])


# --- scale ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("divisor", [1, 2, 3, 7])
@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_scale(dtype, divisor, n):
    buf = random_values(dtype, n, 20)
    if dtype in INTS:
        want = buf // dtype.storage.type(divisor)
    elif dtype in HALVES:
        want = narrow(widen(buf, dtype) / np.float32(divisor), dtype)
    else:
        want = buf / dtype.storage.type(divisor)
    _C.scale(buf, dtype, divisor)
    assert_same(buf, want, dtype)


@pytest.mark.parametrize("dtype", INTS, ids=lambda d: d.name)
@pytest.mark.parametrize("divisor", [2, 3, -1, -2, -5, 2**31 - 1, 2**40, -(2**40)])
def test_scale_integers_floor_divide_like_numpy(dtype, divisor):
    info = np.iinfo(dtype.storage)
    edge = [-3, 3, -4, 4, -1, 0, 1, info.min, info.max, info.min + 1]
    buf = np.concatenate([np.array(edge, dtype.storage), random_values(dtype, 1001, 21)])
    with np.errstate(over="ignore"):
        want = (buf.astype(np.int64) // np.int64(divisor)).astype(dtype.storage) \
            if dtype == DType.INT32 else buf // np.int64(divisor)
    src = buf.copy()
    out = np.empty_like(buf)
    _C.scale_into(out, src, dtype, divisor)
    np.testing.assert_array_equal(out, want)
    _C.scale(buf, dtype, divisor)
    np.testing.assert_array_equal(buf, want)
    if divisor == 2:
        assert buf[0] == -2 and buf[1] == 1  # -3 // 2 == -2, 3 // 2 == 1


# --- scale_into ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("divisor", [1, 2, 3, 7, -3])
@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_scale_into_matches_scale_and_leaves_src_alone(dtype, divisor, n):
    src = random_values(dtype, n, 22)
    before = src.copy()
    want = src.copy()
    _C.scale(want, dtype, divisor)
    dst = np.full_like(src, 5)
    _C.scale_into(dst, src, dtype, divisor)
    assert_same(dst, want, dtype)
    np.testing.assert_array_equal(src, before)


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_scale_into_rounds_like_numpy(dtype):
    src = random_values(dtype, 1009, 23)
    if dtype in INTS:
        want = src // dtype.storage.type(3)
    elif dtype in HALVES:
        want = narrow(widen(src, dtype) / np.float32(3), dtype)
    else:
        want = src / dtype.storage.type(3)
    dst = np.empty_like(src)
    _C.scale_into(dst, src, dtype, 3)
    assert_same(dst, want, dtype)


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_scale_into_the_same_buffer_is_scale(dtype):
    buf = random_values(dtype, 1003, 24)
    want = buf.copy()
    _C.scale(want, dtype, 7)
    _C.scale_into(buf, buf, dtype, 7)
    assert_same(buf, want, dtype)
    _C.scale_into(memoryview(buf), buf, dtype, 1)  # the same memory through two objects
    assert_same(buf, want, dtype)


@pytest.mark.parametrize("dtype", HALVES, ids=lambda d: d.name)
def test_scale_into_halves_on_random_bit_patterns(dtype):
    src = np.random.default_rng(31).integers(0, 2**16, 100003, dtype=np.uint16)
    if dtype == DType.FLOAT16:
        src = src.view(np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        want = narrow(widen(src, dtype) / np.float32(3), dtype)
    dst = np.empty_like(src)
    _C.scale_into(dst, src, dtype, 3)
    assert_same(dst, want, dtype)


def test_scale_into_reads_any_buffer_and_the_wrapper_takes_names():
    src = np.arange(8, dtype=np.float32)
    dst = bytearray(32)
    _C.scale_into(dst, src.tobytes(), DType.FLOAT32, 2)
    np.testing.assert_array_equal(np.frombuffer(dst, np.float32), src / 2)
    out = np.empty(8, np.float16)
    kernels.scale_into(out, src.astype(np.float16), "float16", 4)
    np.testing.assert_array_equal(out, (src / 4).astype(np.float16))
    ints = np.empty(8, np.int64)
    kernels.scale_into(ints, np.arange(-4, 4, dtype=np.int64), np.int64, 3)
    np.testing.assert_array_equal(ints, np.arange(-4, 4) // 3)


# --- buffer kinds and the Python wrapper ---------------------------------------------

def test_accepts_bytes_memoryview_and_bytearray():
    src = np.arange(8, dtype=np.float32)
    dst = bytearray(np.ones(8, np.float32).tobytes())
    _C.sum_into(dst, src.tobytes(), DType.FLOAT32)
    _C.sum_into(memoryview(dst), memoryview(src.tobytes()), DType.FLOAT32)
    np.testing.assert_array_equal(np.frombuffer(dst, np.float32), 1 + 2 * src)


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_misaligned_buffers(dtype):
    # zmq frames and slices of byte buffers need not be aligned to the itemsize.
    def at_offset(array: np.ndarray, offset: int) -> memoryview:
        raw = bytearray(array.nbytes + offset)
        view = memoryview(raw)[offset:]
        view[:] = array.tobytes()
        return view

    dst, src = random_values(dtype, 1003, 40), random_values(dtype, 1003, 41)
    for offset in (1, 3):
        want = dst.copy()
        _C.sum_into(want, src, dtype)
        got = at_offset(dst, offset)
        _C.sum_into(got, at_offset(src, offset), dtype)
        assert_same(np.frombuffer(got, dtype.storage), want, dtype)
        acc = at_offset(kernels.empty_accumulator(1003, dtype), offset)
        _C.accumulate(acc, at_offset(src, offset), dtype, True)
        out = at_offset(np.zeros_like(dst), offset)
        _C.finalize(out, acc, dtype)
        _C.scale(out, dtype, 3)
        expected = src.copy()
        _C.scale(expected, dtype, 3)
        assert_same(np.frombuffer(out, dtype.storage), expected, dtype)
        scaled = at_offset(np.zeros_like(src), offset)
        _C.scale_into(scaled, at_offset(src, offset), dtype, 3)
        assert_same(np.frombuffer(scaled, dtype.storage), expected, dtype)


def test_kernels_wrapper_takes_dtype_names_and_enums():
    a = np.ones(5, np.float16)
    kernels.sum_into(a, np.ones(5, np.float16), "float16")
    kernels.scale(a, np.float16, 4)
    np.testing.assert_array_equal(a, np.full(5, 0.5, np.float16))
    acc = kernels.empty_accumulator(5, DType.BFLOAT16)
    kernels.accumulate(acc, bf16_from_f32(np.full(5, 2.0, np.float32)), "bfloat16", first=True)
    out = np.empty(5, np.uint16)
    kernels.finalize(out, acc, DType.BFLOAT16)
    np.testing.assert_array_equal(f32_from_bf16(out), np.full(5, 2.0, np.float32))


def test_itemsizes_match_dtypes():
    for dtype in DType:
        assert _C.itemsize(dtype) == dtype.itemsize
        assert _C.accumulation_itemsize(dtype) == dtype.accumulation_itemsize


def test_kernel_table_is_callable_through_its_c_abi():
    table = kernels.kernel_table()
    assert table["abi"] == 1 == _C.KERNEL_ABI
    accumulate = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                  ctypes.c_int, ctypes.c_int)(table["accumulate"])
    finalize = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                ctypes.c_int)(table["finalize"])
    src = np.array([1.5, -2.25, 3.0], np.float16)
    acc = np.empty(3, np.float32)
    accumulate(acc.ctypes.data, src.ctypes.data, 3, int(DType.FLOAT16), 1)
    accumulate(acc.ctypes.data, src.ctypes.data, 3, int(DType.FLOAT16), 0)
    out = np.empty(3, np.float16)
    finalize(out.ctypes.data, acc.ctypes.data, 3, int(DType.FLOAT16))
    np.testing.assert_array_equal(out, src * 2)


def test_cpu_features_reports_flags_and_isa(isa):
    features = kernels.cpu_features()
    assert {"avx2", "f16c", "avx512f"} <= set(features)
    assert all(isinstance(features[k], bool) for k in ("avx2", "f16c", "avx512f"))
    assert features["isa"] == isa


# --- errors -------------------------------------------------------------------------------

def test_bad_dtype_code():
    a = np.zeros(4, np.float32)
    for code in (-1, 6):
        with pytest.raises(ValueError, match=f"unknown dtype code {code}"):
            _C.sum_into(a, a, code)
    with pytest.raises(ValueError, match="unknown dtype code 9"):
        _C.itemsize(9)
    with pytest.raises(ValueError, match="unsupported dtype"):
        kernels.sum_into(a, a, "complex64")


def test_size_mismatches_name_argument_and_sizes():
    with pytest.raises(ValueError, match=r"dst has 16 bytes \(4 float32\) but src has 20 bytes"):
        _C.sum_into(np.zeros(4, np.float32), np.zeros(5, np.float32), DType.FLOAT32)
    with pytest.raises(ValueError, match="acc has 8 bytes, but src's 4 float16 elements need 16 bytes"):
        _C.accumulate(np.zeros(2, np.float32), np.zeros(4, np.float16), DType.FLOAT16, True)
    with pytest.raises(ValueError, match="out has 16 bytes, but acc's 4 float32 elements need 8 bytes"):
        _C.finalize(np.zeros(4, np.float32), np.zeros(4, np.float32), DType.BFLOAT16)
    with pytest.raises(ValueError, match="src has 7 bytes, not a multiple of the float32 itemsize 4"):
        _C.sum_into(bytearray(8), b"\0" * 7, DType.FLOAT32)
    with pytest.raises(ValueError, match="buf has 6 bytes, not a multiple of the int64 itemsize 8"):
        _C.scale(bytearray(6), DType.INT64, 2)
    with pytest.raises(ValueError, match=r"dst has 16 bytes \(4 float32\) but src has 12 bytes \(3\)"):
        _C.scale_into(np.zeros(4, np.float32), np.zeros(3, np.float32), DType.FLOAT32, 2)
    with pytest.raises(ValueError, match="src has 6 bytes, not a multiple of the float32 itemsize 4"):
        _C.scale_into(bytearray(8), b"\0" * 6, DType.FLOAT32, 2)


def test_read_only_destinations_are_refused():
    frozen = np.zeros(4, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match=r"dst is read-only \(16 bytes\)"):
        _C.sum_into(frozen, np.zeros(4, np.float32), DType.FLOAT32)
    with pytest.raises(ValueError, match="acc is read-only"):
        _C.accumulate(bytes(16), np.zeros(4, np.float32), DType.FLOAT32, True)
    with pytest.raises(ValueError, match="out is read-only"):
        _C.finalize(bytes(8), np.zeros(4, np.float32), DType.FLOAT16)
    with pytest.raises(ValueError, match="buf is read-only"):
        _C.scale(b"\0" * 8, DType.FLOAT32, 2)
    with pytest.raises(ValueError, match=r"dst is read-only \(8 bytes\)"):
        _C.scale_into(b"\0" * 8, np.zeros(2, np.float32), DType.FLOAT32, 2)


def test_other_bad_arguments():
    a = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="divisor must not be 0"):
        _C.scale(a, DType.FLOAT32, 0)
    with pytest.raises(ValueError, match="src must be a C-contiguous buffer"):
        _C.sum_into(np.zeros(4, np.float32), a[::2], DType.FLOAT32)
    with pytest.raises(TypeError, match="dst must support the buffer protocol"):
        _C.sum_into([1.0, 2.0], a[:2], DType.FLOAT32)
    with pytest.raises(ValueError, match="overlap"):
        _C.sum_into(a[1:5], a[:4], DType.FLOAT32)
    with pytest.raises(ValueError, match="dst and src overlap in memory without being the same buffer"):
        _C.scale_into(a[1:5], a[:4], DType.FLOAT32, 2)
    with pytest.raises(ValueError, match="divisor must not be 0"):
        _C.scale_into(a, a, DType.FLOAT32, 0)
    with pytest.raises(ValueError, match="unknown dtype code 7"):
        _C.scale_into(a, a, 7, 2)
    with pytest.raises(TypeError, match="src must support the buffer protocol"):
        _C.scale_into(a, [1.0] * 8, DType.FLOAT32, 2)
    with pytest.raises(ValueError, match="dst must be a C-contiguous buffer"):
        _C.scale_into(a[::2], a[:4], DType.FLOAT32, 2)
