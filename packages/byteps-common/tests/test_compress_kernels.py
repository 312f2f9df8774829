"""The compression kernels of byteps.common._C against numpy references.

Each reference below is written from the encoding's definition (the header
of csrc/compress_kernels.cpp), not from the C++: xorshift128+ in numpy
uint64 arithmetic, onebit with np.packbits, top-k with a lexicographic sort,
dithering's quantisation vectorised over the draws. Results must match
byte for byte, given the same seed. The compress kernels' error output
(error feedback in the compressing pass) is checked against the two passes
it replaces, decompress and np.subtract, bit for bit. The BytePS v0.2.5
vectors at the end pin the math to BytePS itself.
"""

from __future__ import annotations

import numpy as np
import pytest

from byteps.common import _C
from byteps.common.compression import CompressionSpec, ServerPartition, WorkerPartition
from byteps.common.dtypes import DType

DTYPES = [np.float16, np.float32, np.float64]
SIZES = [1, 2, 7, 31, 32, 33, 1000, 100_003]
TWO_64 = 2.0**64


def code(dtype) -> int:
    return int({np.float16: DType.FLOAT16, np.float32: DType.FLOAT32, np.float64: DType.FLOAT64}[dtype])


def compute_type(dtype):
    """The type BytePS computes an element in: float for float16/float32, double for float64."""
    return np.float64 if dtype == np.float64 else np.float32


# --- references ------------------------------------------------------------------


def ref_xorshift(state: np.ndarray, count: int) -> np.ndarray:
    """count outputs of xorshift128+ from state [a, b], which is advanced in place."""
    a, b = np.uint64(state[0]), np.uint64(state[1])
    out = np.empty(count, np.uint64)
    with np.errstate(over="ignore"):
        for i in range(count):
            t, s = a, b
            a = s
            t ^= t << np.uint64(23)
            t ^= t >> np.uint64(17)
            t ^= s ^ (s >> np.uint64(26))
            b = t
            out[i] = t + s
    state[:] = [a, b]
    return out


def bernoulli(draws: np.ndarray, p: np.ndarray) -> np.ndarray:
    """BytePS's Bernoulli(p), one draw each: (double)draw < p * 2^64."""
    with np.errstate(invalid="ignore", over="ignore"):
        return draws.astype(np.float64) < np.asarray(p, np.float64) * TWO_64


def ref_onebit_compress(x: np.ndarray, scaling: bool) -> bytes:
    n, es = x.size, x.itemsize
    scale = np.float32(1.0)
    if scaling:
        # |x| summed in order in double (cumsum, not numpy's pairwise sum), mean rounded to float32.
        scale = np.float32(np.cumsum(np.abs(x.astype(np.float64)))[-1] / n) if n else np.float32(0)
    words = -(-n // (8 * es))
    bits = np.zeros(words * 8 * es, np.uint8)
    bits[:n] = x < 0
    # packbits puts the first element in the most significant bit of each byte: that is each
    # word big-endian, so reverse each word's bytes for little-endian.
    packed = np.packbits(bits).reshape(words, es)[:, ::-1]
    return packed.tobytes() + scale.tobytes()


def ref_onebit_decompress(blob: bytes, n: int, dtype) -> np.ndarray:
    es = np.dtype(dtype).itemsize
    words = -(-n // (8 * es))
    scale = np.frombuffer(blob, np.float32, 1, words * es)[0]
    be = np.frombuffer(blob, np.uint8, words * es).reshape(words, es)[:, ::-1]
    bits = np.unpackbits(be.reshape(-1))[:n].astype(bool)
    return np.where(bits, -scale, scale).astype(dtype)


def records_dtype(dtype) -> np.dtype:
    return np.dtype([("index", "<u4"), ("value", np.dtype(dtype))])  # packed: no padding


def make_records(x: np.ndarray, indices) -> bytes:
    rec = np.empty(len(indices), records_dtype(x.dtype))
    rec["index"] = indices
    rec["value"] = x[np.asarray(indices, np.int64)]
    return rec.tobytes()


def ref_topk(x: np.ndarray, k: int) -> bytes:
    magnitude = np.abs(x.astype(np.float64))
    nan = np.isnan(magnitude)
    magnitude[nan] = 0
    # Sorted by: NaN first, then larger |x|, then lower index.
    order = np.lexsort((np.arange(x.size), -magnitude, -nan.astype(np.int8)))
    return make_records(x, np.sort(order[:k]))


def ref_randomk(x: np.ndarray, k: int, state: np.ndarray) -> bytes:
    return make_records(x, ref_xorshift(state, k) % np.uint64(x.size))


def ref_sparse_decompress(blob: bytes, n: int, dtype) -> np.ndarray:
    out = np.zeros(n, dtype)
    for index, value in np.frombuffer(blob, records_dtype(dtype)):
        out[index] = value
    return out


def bit_length(v: int) -> int:
    return int(v).bit_length()


def ref_dithering_compress(x: np.ndarray, levels: int, natural: bool, l2: bool, state: np.ndarray) -> bytes:
    n = x.size
    draws = ref_xorshift(state, n)
    xc = x.astype(compute_type(x.dtype))
    with np.errstate(all="ignore"):
        if n == 0:
            scale = 0.0
        elif l2:
            scale = np.sqrt(np.cumsum((xc * xc).astype(np.float64))[-1])
        else:
            scale = np.max(np.abs(x.astype(np.float64)))  # NaN if any element is
        q = np.zeros(n, np.int64)
        if scale > 0 and np.isfinite(scale):
            a = np.abs(xc).astype(np.float32).astype(np.float64)
            if not natural:
                u = ((a / scale) * levels).astype(np.float32)
                fl = np.floor(u)
                qf = fl + bernoulli(draws, u - fl).astype(np.float32)  # u - fl in float32
                q = np.minimum(np.nan_to_num(qf, nan=0, posinf=levels), levels).astype(np.int64)
            else:
                top = 1 << (levels - 1)
                u = (a / scale) * top
                over = ~(u <= top)
                v = np.ceil(np.where(over, 0, u)).astype(np.uint64)
                # round_next_pow2 on uint32: v-1, smear right, +1 (0 -> 0, 1 -> 1)
                v = (v - np.uint64(1)) & np.uint64(0xFFFFFFFF)
                for shift in (1, 2, 4, 8, 16):
                    v |= v >> np.uint64(shift)
                fl = ((v + np.uint64(1)) & np.uint64(0xFFFFFFFF)) >> np.uint64(1)
                fl = np.where(over, top, fl).astype(np.int64)
                length = np.where(fl > 0, fl, 1)
                q = fl + length * bernoulli(draws, (u - fl) / length)
                q = np.minimum(q, top)
    # natural: q = 2^(code-1), exactly, so log2 is exact
    codes = np.where(q > 0, np.log2(np.maximum(q, 1)).astype(np.int64) + 1, 0) if natural else q
    sign = np.signbit(xc) & (q != 0)
    width = 1 + bit_length(levels)
    fields = (codes.astype(np.uint64) << np.uint64(1)) | sign.astype(np.uint64)
    bits = ((fields[:, None] >> np.arange(width, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8)
    stream = np.packbits(bits.reshape(-1), bitorder="little").tobytes()
    return stream + np.float32(scale).tobytes()


def ref_dithering_decompress(blob: bytes, n: int, dtype, levels: int, natural: bool) -> np.ndarray:
    width = 1 + bit_length(levels)
    nbytes = -(-n * width // 8)
    scale = np.frombuffer(blob, np.float32, 1, nbytes)[0]
    bits = np.unpackbits(np.frombuffer(blob, np.uint8, nbytes), bitorder="little")[: n * width]
    fields = bits.reshape(n, width).astype(np.int64) @ (1 << np.arange(width, dtype=np.int64))
    sign, codes = fields & 1, fields >> 1
    q = np.where(codes > 0, 1 << np.maximum(codes - 1, 0), 0) if natural else codes
    divisor = np.float32(1 << (levels - 1) if natural else levels)
    with np.errstate(all="ignore"):
        value = (1 - 2 * sign).astype(np.float32) * (q.astype(np.float32) * scale / divisor)
    return np.where(q == 0, np.float32(0), value).astype(dtype)


# --- data --------------------------------------------------------------------------


def gaussian(n: int, dtype, seed: int = 0) -> np.ndarray:
    """Normal values with some exact +0.0 and -0.0 sprinkled in."""
    rng = np.random.default_rng(seed + n)
    x = rng.standard_normal(n).astype(dtype)
    x[rng.random(n) < 0.05] = 0
    x[rng.random(n) < 0.05] = -0.0
    return x


def distinct_magnitudes(n: int, dtype, seed: int = 0) -> np.ndarray:
    """Values whose |x| are all different (exact multiples of 1/8), with random signs."""
    rng = np.random.default_rng(seed + n)
    signs = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return ((rng.permutation(n) + 1) / 8 * signs).astype(dtype)


def empty_bytes(n: int) -> np.ndarray:
    return np.empty(n, np.uint8)


def seeded(seed: int) -> np.ndarray:
    return np.array([seed, seed], np.uint64)


# --- xorshift128+ --------------------------------------------------------------------


@pytest.mark.parametrize("seed,expected", [
    (1, [8388673, 8388673, 70368752570370, 140737497800769]),
    (42, [352324266, 352324271, 2955487607955550, 5910974865689588]),
    (2020, [16945119460, 16945119256, 142144880192146992, 284289743435189780]),
])
def test_xorshift_byteps_vectors(seed, expected):
    state = seeded(seed)
    np.testing.assert_array_equal(_C.xorshift_next(state, 4), np.array(expected, np.uint64))
    np.testing.assert_array_equal(ref_xorshift(seeded(seed), 4), np.array(expected, np.uint64))


def test_xorshift_matches_reference_and_advances_state_in_place():
    state, ref_state = np.array([12345, 2**63 + 99], np.uint64), np.array([12345, 2**63 + 99], np.uint64)
    for count in (0, 1, 1000, 5000):
        np.testing.assert_array_equal(_C.xorshift_next(state, count), ref_xorshift(ref_state, count))
        np.testing.assert_array_equal(state, ref_state)
    assert _C.xorshift_next(state, 3).dtype == np.uint64


# --- onebit ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES + [15, 16, 17, 63, 64, 65])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scaling", [False, True])
def test_onebit_matches_reference(dtype, n, scaling):
    x = gaussian(n, dtype)
    es = x.itemsize
    nbytes = _C.onebit_compressed_nbytes(n, code(dtype))
    assert nbytes == -(-n // (8 * es)) * es + 4
    out = empty_bytes(nbytes)
    _C.onebit_compress(x, out, code(dtype), scaling)
    assert out.tobytes() == ref_onebit_compress(x, scaling)
    dense = np.empty(n, dtype)
    _C.onebit_decompress(out, dense, code(dtype))
    np.testing.assert_array_equal(dense, ref_onebit_decompress(out.tobytes(), n, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_onebit_negative_zero_and_nan_count_as_positive_and_scale_follows_inf_and_nan(dtype):
    x = np.array([-0.0, np.nan, -np.inf, np.inf, -1, 0], dtype)
    out = empty_bytes(_C.onebit_compressed_nbytes(x.size, code(dtype)))
    dense = np.empty(x.size, dtype)
    _C.onebit_compress(x, out, code(dtype), False)
    assert out.tobytes() == ref_onebit_compress(x, False)
    _C.onebit_decompress(out, dense, code(dtype))
    np.testing.assert_array_equal(dense, np.array([1, 1, -1, 1, -1, 1], dtype))
    _C.onebit_compress(x, out, code(dtype), True)  # a NaN makes the mean |x| NaN
    assert out.tobytes() == ref_onebit_compress(x, True)
    _C.onebit_decompress(out, dense, code(dtype))
    assert np.isnan(dense).all()
    x[1] = 5  # an Inf without NaN makes it Inf
    _C.onebit_compress(x, out, code(dtype), True)
    _C.onebit_decompress(out, dense, code(dtype))
    np.testing.assert_array_equal(dense, np.array([1, 1, -1, 1, -1, 1], dtype) * np.inf)


def test_onebit_all_zeros_with_scaling_decodes_to_zeros():
    x = np.zeros(100, np.float32)
    out = empty_bytes(_C.onebit_compressed_nbytes(100, 0))
    _C.onebit_compress(x, out, 0, True)
    dense = np.ones(100, np.float32)
    _C.onebit_decompress(out, dense, 0)
    assert not dense.any()


def test_onebit_empty_input_is_just_a_scale():
    assert _C.onebit_compressed_nbytes(0, 0) == 4
    out = empty_bytes(4)
    _C.onebit_compress(np.zeros(0, np.float32), out, 0, True)
    assert out.view(np.float32)[0] == 0  # the mean of nothing is taken as 0, not 0/0
    _C.onebit_decompress(out, np.zeros(0, np.float32), 0)


# --- topk / randomk / sparse records ---------------------------------------------------


def topk_sizes_and_ks():
    for n in SIZES:
        for k in sorted({1, max(1, n // 10), n}):
            yield n, k


@pytest.mark.parametrize("n,k", list(topk_sizes_and_ks()))
@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_matches_reference(dtype, n, k):
    # float16 has ~31k distinct finite magnitudes, so its 100_003-element input has ties; the
    # reference breaks them by the same rule (lower index) that test_topk_ties_* pins down.
    x = gaussian(n, dtype) if (dtype == np.float16 and n > 2048) else distinct_magnitudes(n, dtype)
    out = empty_bytes(_C.sparse_compressed_nbytes(k, code(dtype)))
    assert out.size == k * (4 + x.itemsize)
    _C.topk_compress(x, out, code(dtype), k)
    assert out.tobytes() == ref_topk(x, k)
    dense = np.empty(n, dtype)
    _C.sparse_decompress(out, dense, code(dtype))
    np.testing.assert_array_equal(dense, ref_sparse_decompress(out.tobytes(), n, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_ties_go_to_the_lower_index(dtype):
    x = np.array([1, 1, 2, 1, -1, 1], dtype)
    out = empty_bytes(_C.sparse_compressed_nbytes(2, code(dtype)))
    _C.topk_compress(x, out, code(dtype), 2)
    assert list(np.frombuffer(out.tobytes(), records_dtype(dtype))["index"]) == [0, 2]
    x = np.array([-0.0, 0.0, 0.0, -3, 3, 3, -3], dtype)
    out = empty_bytes(_C.sparse_compressed_nbytes(5, code(dtype)))
    _C.topk_compress(x, out, code(dtype), 5)
    rec = np.frombuffer(out.tobytes(), records_dtype(dtype))
    assert list(rec["index"]) == [0, 3, 4, 5, 6]
    assert np.signbit(rec["value"][0])  # values are copied as they are, -0.0 included
    x = np.full(1000, 0.5, dtype)
    out = empty_bytes(_C.sparse_compressed_nbytes(10, code(dtype)))
    _C.topk_compress(x, out, code(dtype), 10)
    assert list(np.frombuffer(out.tobytes(), records_dtype(dtype))["index"]) == list(range(10))


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_nan_ranks_above_inf_which_ranks_above_numbers(dtype):
    x = np.array([1, -np.inf, 5, np.nan, -7, np.nan, 2], dtype)
    out = empty_bytes(_C.sparse_compressed_nbytes(4, code(dtype)))
    _C.topk_compress(x, out, code(dtype), 4)
    assert out.tobytes() == ref_topk(x, 4)
    assert list(np.frombuffer(out.tobytes(), records_dtype(dtype))["index"]) == [1, 3, 4, 5]


@pytest.mark.parametrize("layout", ["sampled_positions_largest", "sampled_positions_smallest", "nan_and_inf"])
@pytest.mark.parametrize("k", [1, 10, 1000, 1024, 1025])
def test_topk_selects_exactly_whatever_the_layout(layout, k):
    # k <= n/16 selects from the elements above a strided sample's order statistic; a layout
    # that puts the largest values exactly on the sampled positions leaves fewer than k above it.
    n = 16 * 1024
    x = distinct_magnitudes(n, np.float32, seed=k)
    on_sample = np.arange(n) % 16 == 0
    if layout == "sampled_positions_largest":
        x[on_sample] *= 1e6
    elif layout == "sampled_positions_smallest":
        x[on_sample] *= 1e-6
    else:
        x[np.random.default_rng(k).choice(n, 20, replace=False)] = [np.nan] * 10 + [np.inf] * 5 + [-np.inf] * 5
    out = empty_bytes(_C.sparse_compressed_nbytes(k, 0))
    _C.topk_compress(x, out, 0, k)
    assert out.tobytes() == ref_topk(x, k)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_randomk_matches_reference_across_steps(dtype, n):
    x = gaussian(n, dtype)
    state, ref_state = seeded(n + 5), seeded(n + 5)
    for k in (1, 3, max(1, n // 4)):
        out = empty_bytes(_C.sparse_compressed_nbytes(k, code(dtype)))
        _C.randomk_compress(x, out, code(dtype), k, state)
        assert out.tobytes() == ref_randomk(x, k, ref_state)
        np.testing.assert_array_equal(state, ref_state)
        dense = np.empty(n, dtype)
        _C.sparse_decompress(out, dense, code(dtype))
        np.testing.assert_array_equal(dense, ref_sparse_decompress(out.tobytes(), n, dtype))


def test_randomk_with_nan_and_inf_copies_them():
    x = np.array([np.nan, np.inf, -np.inf], np.float32)
    out = empty_bytes(_C.sparse_compressed_nbytes(50, 0))
    state, ref_state = seeded(3), seeded(3)
    _C.randomk_compress(x, out, 0, 50, state)
    assert out.tobytes() == ref_randomk(x, 50, ref_state)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sparse_decompress_later_duplicates_win(dtype):
    rec = np.zeros(4, records_dtype(dtype))
    rec["index"] = [2, 0, 2, 4]
    rec["value"] = [1, 2, 3, -4]
    dense = np.full(5, 9, dtype)
    _C.sparse_decompress(rec.tobytes(), dense, code(dtype))
    np.testing.assert_array_equal(dense, np.array([2, 0, 3, 0, -4], dtype))
    _C.sparse_decompress(b"", dense, code(dtype))  # no records: all zeros
    assert not dense.any()


def test_sparse_decompress_index_out_of_range_names_it_and_leaves_dst_alone():
    rec = np.zeros(3, records_dtype(np.float32))
    rec["index"] = [0, 5, 1]
    dense = np.full(5, 9, np.float32)
    with pytest.raises(ValueError, match="record 1 has index 5"):
        _C.sparse_decompress(rec.tobytes(), dense, 0)
    assert np.all(dense == 9)
    with pytest.raises(ValueError, match="not a whole number of 8-byte"):
        _C.sparse_decompress(rec.tobytes()[:-1], dense, 0)


# --- dithering ---------------------------------------------------------------------------

MODES = [  # (levels, natural, l2)
    (4, False, False),
    (4, True, False),
    (3, False, True),
    (2, True, True),
    (1, False, False),
    (255, False, True),
    (31, True, False),
]


@pytest.mark.parametrize("levels,natural,l2", MODES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dithering_matches_reference(dtype, n, levels, natural, l2):
    x = gaussian(n, dtype)
    nbytes = _C.dithering_compressed_nbytes(n, levels)
    assert nbytes == -(-n * (1 + bit_length(levels)) // 8) + 4
    state, ref_state = seeded(7), seeded(7)
    for _ in range(2):  # the state carries over from one round to the next
        out = empty_bytes(nbytes)
        _C.dithering_compress(x, out, code(dtype), levels, natural, l2, state)
        assert out.tobytes() == ref_dithering_compress(x, levels, natural, l2, ref_state)
        np.testing.assert_array_equal(state, ref_state)
        dense = np.empty(n, dtype)
        _C.dithering_decompress(out, dense, code(dtype), levels, natural)
        np.testing.assert_array_equal(dense, ref_dithering_decompress(out.tobytes(), n, dtype, levels, natural))


@pytest.mark.parametrize("natural", [False, True])
@pytest.mark.parametrize("l2", [False, True])
@pytest.mark.parametrize("fill", [0.0, np.nan, np.inf])
def test_dithering_zero_nan_or_inf_scale_gives_all_zeros_and_still_draws_n(fill, l2, natural):
    x = gaussian(100, np.float32)
    x[:] = 0
    x[17] = fill
    out = empty_bytes(_C.dithering_compressed_nbytes(100, 4))
    state = seeded(9)
    _C.dithering_compress(x, out, 0, 4, natural, l2, state)
    assert not out[:-4].any()
    expected = seeded(9)
    ref_xorshift(expected, 100)
    np.testing.assert_array_equal(state, expected)
    dense = np.full(100, 5, np.float32)
    _C.dithering_decompress(out, dense, 0, 4, natural)
    assert not dense.any() and not np.signbit(dense).any()


def test_dithering_empty_input_is_just_a_scale():
    out = empty_bytes(_C.dithering_compressed_nbytes(0, 4))
    assert out.size == 4
    _C.dithering_compress(np.zeros(0, np.float32), out, 0, 4, False, False, seeded(1))
    _C.dithering_decompress(out, np.zeros(0, np.float32), 0, 4, False)


@pytest.mark.parametrize("levels,natural", [(7, False), (3, True)])
def test_dithering_float64_level_rounded_past_the_top_is_clamped(levels, natural):
    # float32(|x0|) = 1 + 2^-22 > scale = x0 = 1 + 3*2^-24, so u lands just past the top level
    # and seed 1's tiny first draw rounds it up: BytePS would send q = top + 1 (linear) or
    # 2*top (natural), decoding above max |x|; the field holds at most the top level.
    x = np.array([1 + 3 * 2.0**-24, 0.25, -0.5], np.float64)
    out = empty_bytes(_C.dithering_compressed_nbytes(3, levels))
    state, ref_state = seeded(1), seeded(1)
    _C.dithering_compress(x, out, code(np.float64), levels, natural, False, state)
    assert out.tobytes() == ref_dithering_compress(x, levels, natural, False, ref_state)
    dense = np.empty(3, np.float64)
    _C.dithering_decompress(out, dense, code(np.float64), levels, natural)
    assert dense[0] == np.float32(x[0])


def test_dithering_decompress_rejects_a_code_above_levels():
    blob = np.zeros(_C.dithering_compressed_nbytes(4, 5), np.uint8)  # 4 bits per field
    blob[1] = 0b1110  # field 2: code 7 > 5
    with pytest.raises(ValueError, match="element 2 has level code 7 above levels = 5"):
        _C.dithering_decompress(blob, np.zeros(4, np.float32), 0, 5, False)


# --- error feedback and momentum ---------------------------------------------------------


@pytest.mark.parametrize("n", [1, 7, 33, 100_003])
@pytest.mark.parametrize("dtype", DTYPES)
def test_axpy_matches_reference(dtype, n):
    alpha = 0.3  # not a float32: the kernel rounds it to one, as BytePS's float alpha
    dst, src = gaussian(n, dtype, 1), gaussian(n, dtype, 2)
    ct = compute_type(dtype)
    expected = (dst.astype(ct) + ct(np.float32(alpha)) * src.astype(ct)).astype(dtype)
    _C.axpy(dst, src, code(dtype), alpha)
    np.testing.assert_array_equal(dst, expected)
    expected = (dst.astype(ct) + ct(np.float32(alpha)) * dst.astype(ct)).astype(dtype)
    _C.axpy(dst, dst, code(dtype), alpha)  # in place on itself
    np.testing.assert_array_equal(dst, expected)


@pytest.mark.parametrize("n", [1, 7, 33, 100_003])
@pytest.mark.parametrize("dtype", DTYPES)
def test_nesterov_matches_reference(dtype, n):
    mu = 0.9
    grad, momentum = gaussian(n, dtype, 3), gaussian(n, dtype, 4)
    ct, m_u = compute_type(dtype), compute_type(dtype)(np.float32(mu))
    m = (grad.astype(ct) + m_u * momentum.astype(ct)).astype(dtype)
    g = (grad.astype(ct) + m_u * m.astype(ct)).astype(dtype)
    _C.nesterov(grad, momentum, code(dtype), mu)
    np.testing.assert_array_equal(momentum, m)
    np.testing.assert_array_equal(grad, g)


# --- argument checking -------------------------------------------------------------------

X = np.arange(10, dtype=np.float32)


@pytest.mark.parametrize("call", [
    lambda d: _C.onebit_compress(X, empty_bytes(8), d, False),
    lambda d: _C.topk_compress(X, empty_bytes(8), d, 1),
    lambda d: _C.randomk_compress(X, empty_bytes(8), d, 1, seeded(1)),
    lambda d: _C.sparse_decompress(b"", np.zeros(10, np.float32), d),
    lambda d: _C.dithering_compress(X, empty_bytes(8), d, 4, False, False, seeded(1)),
    lambda d: _C.axpy(X.copy(), X, d, 1.0),
    lambda d: _C.onebit_compressed_nbytes(10, d),
    lambda d: _C.sparse_compressed_nbytes(1, d),
])
def test_non_float_or_unknown_dtype_raises_naming_it(call):
    for dtype, name in [(DType.BFLOAT16, "bfloat16"), (DType.INT32, "int32"), (DType.INT64, "int64")]:
        with pytest.raises(ValueError, match=name):
            call(int(dtype))
    with pytest.raises(ValueError, match="unknown dtype code 9"):
        call(9)


def test_wrong_dst_size_raises_naming_dst():
    for call in [
        lambda: _C.onebit_compress(X, empty_bytes(9), 0, False),
        lambda: _C.topk_compress(X, empty_bytes(7), 0, 1),
        lambda: _C.randomk_compress(X, empty_bytes(24), 0, 2, seeded(1)),
        lambda: _C.dithering_compress(X, empty_bytes(10), 0, 4, False, False, seeded(1)),
    ]:
        with pytest.raises(ValueError, match="^dst has"):
            call()
    for call in [
        lambda: _C.onebit_decompress(empty_bytes(9), np.zeros(10, np.float32), 0),
        lambda: _C.dithering_decompress(empty_bytes(10), np.zeros(10, np.float32), 0, 4, False),
    ]:
        with pytest.raises(ValueError, match="^src has"):
            call()
    with pytest.raises(ValueError, match="^dst has 10 float32 elements but src has 9"):
        _C.axpy(np.zeros(10, np.float32), np.zeros(9, np.float32), 0, 1.0)
    with pytest.raises(ValueError, match="src has 10 bytes, not a multiple of the float64 itemsize"):
        _C.onebit_compress(empty_bytes(10), empty_bytes(12), 1, False)


def test_k_out_of_range_raises_naming_k():
    for k in (0, -1, 11):
        with pytest.raises(ValueError, match="^k must be in 1..n = 10"):
            _C.topk_compress(X, empty_bytes(8), 0, k)
    with pytest.raises(ValueError, match="^k must be >= 1"):
        _C.randomk_compress(X, empty_bytes(8), 0, 0, seeded(1))
    with pytest.raises(ValueError, match="^k must be >= 0"):
        _C.sparse_compressed_nbytes(-1, 0)
    with pytest.raises(ValueError, match="src is empty"):
        _C.randomk_compress(np.zeros(0, np.float32), empty_bytes(8), 0, 1, seeded(1))


def test_levels_out_of_range_raise_naming_levels():
    for levels, natural in [(0, False), (2**24 + 1, False), (32, True), (0, True)]:
        with pytest.raises(ValueError, match="^levels must be in"):
            _C.dithering_compress(X, empty_bytes(64), 0, levels, natural, False, seeded(1))
        with pytest.raises(ValueError, match="^levels must be in"):
            _C.dithering_decompress(empty_bytes(64), np.zeros(10, np.float32), 0, levels, natural)
    with pytest.raises(ValueError, match="^levels must be in"):
        _C.dithering_compressed_nbytes(10, 0)
    with pytest.raises(ValueError, match="^count must be >= 0"):
        _C.dithering_compressed_nbytes(-1, 4)


def test_read_only_outputs_raise_naming_them():
    ro = empty_bytes(8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="^dst is read-only"):
        _C.onebit_compress(X, ro, 0, False)
    with pytest.raises(ValueError, match="^dst is read-only"):
        _C.sparse_decompress(b"", bytes(40), 0)
    state = seeded(1)
    state.flags.writeable = False
    with pytest.raises(ValueError, match="^state is read-only"):
        _C.randomk_compress(X, empty_bytes(8), 0, 1, state)
    with pytest.raises(ValueError, match="^grad is read-only"):
        _C.nesterov(bytes(40), np.zeros(10, np.float32), 0, 0.9)


def test_bad_state_or_non_buffers_raise():
    with pytest.raises(TypeError, match="^state must be a uint64 array"):
        _C.xorshift_next(np.array([1, 1], np.int64), 1)
    with pytest.raises(ValueError, match=r"^state must hold two uint64 \[a, b\] \(16 bytes\), got 24"):
        _C.xorshift_next(np.array([1, 1, 1], np.uint64), 1)
    with pytest.raises(TypeError, match="^src must support the buffer protocol"):
        _C.onebit_compress([1.0, 2.0], empty_bytes(8), 0, False)
    with pytest.raises(ValueError, match="^count must be >= 0"):
        _C.xorshift_next(seeded(1), -1)


def test_overlapping_buffers_raise():
    buf = np.zeros(64, np.uint8)
    with pytest.raises(ValueError, match="src and dst must not overlap"):
        _C.onebit_compress(buf[:40].view(np.float32), buf[32:40], 0, False)
    g = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="grad and momentum must not overlap"):
        _C.nesterov(g, g, 0, 0.9)


# --- error feedback in the compressing pass (error=) -------------------------------------
# Every compress kernel takes an optional `error` output: error = src - decompress(dst), which
# the feedback once computed in two more passes (decompress into error, then np.subtract). The
# fused output must be those bits exactly, NaN payloads included, and change nothing else.

EF_SIZES = [1, 2, 7, 33, 1001, 4099]
EF_DITHERING = {  # name: (levels, natural, l2)
    "dithering-linear-max": (4, False, False),
    "dithering-linear-l2": (3, False, True),
    "dithering-natural-max": (4, True, False),
    "dithering-natural-l2": (2, True, True),
    "dithering-linear-255-max": (255, False, False),
    "dithering-linear-1000-max": (1000, False, False),  # fields of 11 bits: values computed, not tabulated
}
EF_COMPRESSORS = ["onebit", "onebit-scaling", "topk", "topk-all", "randomk", "randomk-many", *EF_DITHERING]

# NaN bit patterns, quiet and signaling, both signs, with payloads: x - y quiets them, keeping the payload.
NAN_BITS = {
    np.float16: (np.uint16, [0x7C01, 0xFE00, 0x7E55, 0xFD00]),
    np.float32: (np.uint32, [0x7F800001, 0xFFC00000, 0x7FC12345, 0xFF812345]),
    np.float64: (np.uint64, [0x7FF0000000000001, 0xFFF8000000000000, 0x7FF8123456789ABC, 0xFFF0000000000ABC]),
}


def ef_data(kind: str, n: int, dtype) -> np.ndarray:
    """gaussian(n), with (but for "gaussian") the first element and about one in eight special:
    "nan": NaNs of NAN_BITS and infinities; "inf": infinities only (an Inf scale, no NaN);
    "extremes": subnormals, the largest finite values, signed zeros and repeated magnitudes (ties),
    and in float64 values past float32's range (a finite scale that is Inf as a float32)."""
    x = gaussian(n, dtype, seed=17)
    if kind == "gaussian":
        return x
    rng = np.random.default_rng(n)
    where = rng.random(n) < 0.125
    where[0] = True
    info = np.finfo(dtype)
    if kind == "nan":
        uint, patterns = NAN_BITS[dtype]
        specials = np.array(patterns, uint).view(dtype).tolist() + [np.inf, -np.inf]
    elif kind == "inf":
        specials = [np.inf, -np.inf]
    else:
        specials = [info.smallest_subnormal, -3 * info.smallest_subnormal, info.max, -info.max, -0.0, 0.0, 0.5, -0.5]
        if dtype == np.float64:
            specials += [1e300, -3e38 * 2]
    values = np.array(specials, dtype)
    picks = values[rng.integers(0, values.size, int(where.sum()))]
    x[where] = picks  # assignment of float arrays copies NaN bits as they are
    return x


def ef_kernels(name: str, n: int, dtype):
    """(dst's nbytes, compress(src, dst, state, **error), decompress(src, dst)) for a compressor."""
    c = code(dtype)
    if name.startswith("onebit"):
        scaling = name == "onebit-scaling"
        return (_C.onebit_compressed_nbytes(n, c),
                lambda x, out, state, **kw: _C.onebit_compress(x, out, c, scaling, **kw),
                lambda out, dense: _C.onebit_decompress(out, dense, c))
    if name in ("topk", "topk-all", "randomk", "randomk-many"):
        k = {"topk": max(1, n // 10), "topk-all": n, "randomk": max(1, n // 10), "randomk-many": 3 * n}[name]
        if name.startswith("topk"):
            def compress(x, out, state, **kw):
                _C.topk_compress(x, out, c, k, **kw)
        else:  # randomk-many draws many indices twice or more
            def compress(x, out, state, **kw):
                _C.randomk_compress(x, out, c, k, state, **kw)
        return _C.sparse_compressed_nbytes(k, c), compress, lambda out, dense: _C.sparse_decompress(out, dense, c)
    levels, natural, l2 = EF_DITHERING[name]
    return (_C.dithering_compressed_nbytes(n, levels),
            lambda x, out, state, **kw: _C.dithering_compress(x, out, c, levels, natural, l2, state, **kw),
            lambda out, dense: _C.dithering_decompress(out, dense, c, levels, natural))


def two_pass(compress, decompress, x: np.ndarray, nbytes: int, state: np.ndarray):
    """The compressed bytes and error as the feedback computed them before the fused kernels."""
    out = empty_bytes(nbytes)
    compress(x, out, state)
    error = np.empty_like(x)
    decompress(out, error)
    with np.errstate(all="ignore"):
        np.subtract(x, error, out=error)
    return out, error


@pytest.mark.parametrize("kind", ["gaussian", "nan", "inf", "extremes"])
@pytest.mark.parametrize("n", EF_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", EF_COMPRESSORS)
def test_error_output_is_the_two_pass_error_bit_for_bit(name, dtype, n, kind):
    x = ef_data(kind, n, dtype)
    before = x.tobytes()
    nbytes, compress, decompress = ef_kernels(name, n, dtype)
    state = seeded(n + 11)
    out, error = two_pass(compress, decompress, x, nbytes, state)

    fused_state, fused_out, fused_error = seeded(n + 11), empty_bytes(nbytes), np.full_like(x, 7)
    compress(x, fused_out, fused_state, error=fused_error)
    assert fused_out.tobytes() == out.tobytes()  # the same encoding, from the same draws
    np.testing.assert_array_equal(fused_state, state)  # and the same number of them
    assert fused_error.tobytes() == error.tobytes()
    assert x.tobytes() == before

    # In place: error is src itself (what the server does with its copy of the sum).
    inplace, inplace_state, inplace_out = x.copy(), seeded(n + 11), empty_bytes(nbytes)
    compress(inplace, inplace_out, inplace_state, error=inplace)
    assert inplace_out.tobytes() == out.tobytes()
    np.testing.assert_array_equal(inplace_state, state)
    assert inplace.tobytes() == error.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
def test_error_output_quiets_signaling_nans_and_keeps_payloads_as_numpy(dtype):
    # A NaN makes dithering's scale NaN, so every element decodes to +0 and its error is x - 0:
    # numpy's subtraction quiets a signaling NaN and keeps its payload (float16's through
    # float32), where the kernels' float16 store would give every NaN one payload.
    uint, patterns = NAN_BITS[dtype]
    x = np.array(patterns, uint).view(dtype)
    error = np.empty_like(x)
    _C.dithering_compress(x, empty_bytes(_C.dithering_compressed_nbytes(x.size, 4)), code(dtype), 4, False, False,
                          seeded(1), error=error)
    with np.errstate(invalid="ignore"):
        assert error.tobytes() == (x - np.zeros_like(x)).tobytes()
    quiet = {np.float16: 0x0200, np.float32: 0x00400000, np.float64: 0x0008000000000000}[dtype]
    np.testing.assert_array_equal(error.view(uint), x.view(uint) | uint(quiet))


def test_error_output_of_randomk_duplicates_and_topk_ties():
    # randomk draws with replacement: a repeated index decodes to the value it was drawn with, so
    # its error is x - x (+0, or NaN for an infinity); topk's ties leave the higher indices' values.
    x = np.array([2.0, -np.inf, 0.5, 3.0], np.float32)
    out, error = empty_bytes(_C.sparse_compressed_nbytes(40, 0)), np.empty(4, np.float32)
    _C.randomk_compress(x, out, 0, 40, seeded(5), error=error)
    drawn = np.frombuffer(out.tobytes(), records_dtype(np.float32))["index"]
    assert set(drawn) == {0, 1, 2, 3} and len(set(drawn)) < drawn.size
    np.testing.assert_array_equal(error[[0, 2, 3]], 0)
    assert not np.signbit(error[[0, 2, 3]]).any() and np.isnan(error[1])
    x = np.array([1, -2, 2, 2, -2, 1], np.float32)
    error = np.empty(6, np.float32)
    _C.topk_compress(x, empty_bytes(_C.sparse_compressed_nbytes(2, 0)), 0, 2, error=error)
    np.testing.assert_array_equal(error, [1, 0, 0, 2, -2, 1])


def test_bad_error_outputs_raise_naming_error():
    calls = {  # name: (dst nbytes, call(src, dst, state, error))
        "onebit": (8, lambda x, d, s, e: _C.onebit_compress(x, d, 0, True, error=e)),
        "topk": (8, lambda x, d, s, e: _C.topk_compress(x, d, 0, 1, error=e)),
        "randomk": (8, lambda x, d, s, e: _C.randomk_compress(x, d, 0, 1, s, error=e)),
        "dithering": (9, lambda x, d, s, e: _C.dithering_compress(x, d, 0, 4, False, False, s, error=e)),
    }
    for name, (nbytes, call) in calls.items():
        state = seeded(1)
        with pytest.raises(ValueError, match="^error has 9 float32 elements but src has 10"):
            call(X, empty_bytes(nbytes), state, np.zeros(9, np.float32))
        read_only = np.zeros(10, np.float32)
        read_only.flags.writeable = False
        with pytest.raises(ValueError, match="^error is read-only"):
            call(X, empty_bytes(nbytes), state, read_only)
        with pytest.raises(TypeError, match="^error must support the buffer protocol"):
            call(X, empty_bytes(nbytes), state, [0.0] * 10)
        shared = np.zeros(64, np.uint8)  # dst = bytes 0..nbytes, error = bytes 4..44
        with pytest.raises(ValueError, match="^error and dst must not overlap"):
            call(X, shared[:nbytes], state, shared[4:44].view(np.float32))
        src_and_error = np.zeros(11, np.float32)  # error one element past src: overlapping, not the same
        with pytest.raises(ValueError, match="^error and src must not overlap"):
            call(src_and_error[:10], empty_bytes(nbytes), state, src_and_error[1:])
        if name in ("randomk", "dithering"):
            block = np.zeros(7, np.uint64)  # state = words 0..1, error = words 1..6
            with pytest.raises(ValueError, match="^error and state must not overlap"):
                call(X, empty_bytes(nbytes), block[:2], block[1:6].view(np.float32))
        np.testing.assert_array_equal(state, seeded(1))  # refused before any draw


# --- the feedback around the codec (WorkerPartition, ServerPartition) ---------------------


class TwoPassCodec:
    """A PartitionCodec whose error update is the one before the fused kernels: compress, then
    decompress and np.subtract (into a temporary, so that the error may be the input itself)."""

    def __init__(self, codec) -> None:
        self.codec, self.nbytes = codec, codec.nbytes

    def compress(self, dense, out, error=None) -> None:
        self.codec.compress(dense, out)
        if error is not None:
            decoded = np.empty_like(dense)
            self.codec.decompress(out, decoded)
            np.subtract(dense, decoded, out=error)

    def decompress(self, compressed, dense) -> None:
        self.codec.decompress(compressed, dense)


FEEDBACK_SPECS = [
    {"compressor": "onebit", "scaling": True},
    {"compressor": "topk", "k": 0.1},
    {"compressor": "randomk", "k": 0.5, "seed": 3},
    {"compressor": "dithering", "k": 4.0, "seed": 3},
    {"compressor": "dithering", "k": 3.0, "natural": True, "l2": True, "seed": 5},
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("params", FEEDBACK_SPECS,
                         ids=["onebit-scaling", "topk", "randomk", "dithering-linear", "dithering-natural-l2"])
def test_worker_and_server_feedback_match_the_two_pass_update(params, dtype):
    # Nesterov momentum, a prescale, a changing learning rate (then none), and the server's error
    # kept in place over its copy of the sum: payloads, answers and errors as before, round by round.
    spec, n = CompressionSpec(**params, ef=True, momentum=0.9), 1001
    dt = {np.float16: DType.FLOAT16, np.float32: DType.FLOAT32, np.float64: DType.FLOAT64}[dtype]
    worker, reference = WorkerPartition(spec, dt, n), WorkerPartition(spec, dt, n)
    reference.codec = TwoPassCodec(reference.codec)
    server, server_reference = ServerPartition(spec, dt, n), ServerPartition(spec, dt, n)
    server_reference.codec = TwoPassCodec(server_reference.codec)
    for step, lr in enumerate([0.1, 0.05, 0.05, None]):
        grad = gaussian(n, dtype, seed=step)
        payload = worker.compress(grad.view(np.uint8), lr, 0.5).tobytes()
        assert payload == reference.compress(grad.view(np.uint8), lr, 0.5).tobytes()
        assert worker.error.tobytes() == reference.error.tobytes()
        dense, sent_lr = server.decompress_push(payload)
        total = (dense + gaussian(n, dtype, seed=50 + step)).tobytes()  # and another worker's push
        answer = server.compress_sum(total, sent_lr)
        assert answer.tobytes() == server_reference.compress_sum(total, sent_lr).tobytes()
        assert server.error.tobytes() == server_reference.error.tobytes()
        assert worker.error.any() and server.error.any()


# --- BytePS v0.2.5 vectors ----------------------------------------------------------------

V = np.array([0.5, -1, 0, 2, -0.25, 3, -3, 0.125, 1.5, -0.75], np.float32)


def test_byteps_vectors_onebit():
    out = empty_bytes(8)
    _C.onebit_compress(V, out, 0, False)
    assert out.tobytes().hex() == "0000404a0000803f"
    _C.onebit_compress(V, out, 0, True)
    assert out.tobytes().hex() == "0000404a33339b3f"
    dense = np.empty(10, np.float32)
    _C.onebit_decompress(out, dense, 0)
    np.testing.assert_array_equal(dense, np.where(V < 0, -1, 1) * np.float32(1.2125))
    _C.onebit_compress(np.array([-0.0, 0.0, -1], np.float32), out, 0, True)
    assert out.tobytes().hex() == "00000020abaaaa3e"


def test_byteps_vectors_topk_and_randomk():
    out = empty_bytes(24)
    _C.topk_compress(V, out, 0, 3)  # BytePS's heap order happens to be index order here
    assert out.tobytes().hex() == "03000000" "00000040" "05000000" "00004040" "06000000" "000040c0"

    def records(state):
        _C.randomk_compress(V, out, 0, 3, state)
        rec = np.frombuffer(out.tobytes(), records_dtype(np.float32))
        return [(int(i), float(v)) for i, v in rec]

    state = seeded(1)
    assert records(state) == [(3, 2.0), (3, 2.0), (0, 0.5)]
    assert records(state) == [(9, -0.75), (1, -1.0), (4, -0.25)]
    assert records(seeded(42)) == [(6, -3.0), (1, -1.0), (0, 0.5)]


@pytest.mark.parametrize("levels,natural,l2,seed,steps", [
    (4, False, False, 42, [[0.75, -1.5, 0, 2.25, -0.75, 3, -3, 0, 1.5, -0.75],
                           [0.75, -0.75, 0, 2.25, 0, 3, -3, 0, 1.5, -0.75]]),
    (4, True, False, 42, [[0.75, -1.5, 0, 3, -0.375, 3, -3, 0.375, 1.5, -0.75]]),
    (4, False, True, 42, [[1.278198, -1.278198, 0, 2.556395, -1.278198, 3.834593, -2.556395, 0,
                           1.278198, -1.278198]]),
    (2, True, True, 7, [[2.556395, -2.556395, 0, 2.556395, -2.556395, 5.11279, -5.11279, 0,
                         2.556395, -2.556395]]),
])
def test_byteps_vectors_dithering(levels, natural, l2, seed, steps):
    state = seeded(seed)
    out = empty_bytes(_C.dithering_compressed_nbytes(10, levels))
    dense = np.empty(10, np.float32)
    for expected in steps:
        _C.dithering_compress(V, out, 0, levels, natural, l2, state)
        _C.dithering_decompress(out, dense, 0, levels, natural)
        np.testing.assert_allclose(dense, np.array(expected, np.float32), rtol=1e-6, atol=0)
