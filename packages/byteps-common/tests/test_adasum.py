"""Adasum's arithmetic (byteps.common.frontend.adasum) against Horovod's definition written out here.

The jobs that run Adasum through real workers are in the adapters' tests
(torch, tf, mxnet ops checks); these check the formula itself.
"""

from __future__ import annotations

import numpy as np
import pytest

from byteps.common.frontend.adasum import adasum_pair, adasum_tree, check_adasum


def horovod_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b in float64."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    dot = a @ b
    return (1 - dot / (2 * (a @ a))) * a + (1 - dot / (2 * (b @ b))) * b


def test_parallel_gradients_are_averaged_and_orthogonal_ones_added():
    a = np.array([1.0, 2.0, -3.0], np.float32)
    assert np.allclose(adasum_pair(a, 3 * a), 2 * a)        # (a + 3a) / 2
    b = np.array([2.0, -1.0, 0.0], np.float32)              # a.b == 0
    assert np.array_equal(adasum_pair(a, b), a + b)


def test_a_pair_matches_horovods_formula_and_keeps_the_dtype():
    rng = np.random.default_rng(3)
    for dtype in (np.float16, np.float32, np.float64):
        a, b = rng.normal(size=(4, 5)).astype(dtype), rng.normal(size=(4, 5)).astype(dtype)
        got = adasum_pair(a, b)
        assert got.dtype == dtype and got.shape == (4, 5)
        want = horovod_pair(a.ravel(), b.ravel()).astype(dtype).reshape(4, 5)
        assert np.allclose(got, want, rtol=1e-3 if dtype == np.float16 else 1e-6)


def test_a_zero_gradient_leaves_the_other_unchanged():
    a = np.zeros(3, np.float32)
    b = np.array([1.0, 2.0, 3.0], np.float32)
    assert np.array_equal(adasum_pair(a, b), b) and np.array_equal(adasum_pair(b, a), b)


def test_the_tree_pairs_neighbours_first_as_horovod():
    rng = np.random.default_rng(5)
    g = [rng.normal(size=6) for _ in range(4)]
    want = horovod_pair(horovod_pair(g[0], g[1]), horovod_pair(g[2], g[3]))
    assert np.allclose(adasum_tree(g), want)
    other_order = horovod_pair(horovod_pair(g[0], g[2]), horovod_pair(g[1], g[3]))
    assert not np.allclose(want, other_order)  # the pairing matters, so the check above means something
    assert np.array_equal(adasum_tree(g[:1]), g[0])


def test_limits_are_horovods():
    check_adasum(4, np.float32, "allreduce")
    with pytest.raises(NotImplementedError, match="power-of-two number of ranks.*has 3"):
        check_adasum(3, np.float32, "allreduce('x', op=Adasum)")
    with pytest.raises(NotImplementedError, match="floating-point tensors only, got int32"):
        check_adasum(2, np.int32, "allreduce")
    with pytest.raises(NotImplementedError, match="power-of-two"):
        adasum_tree([np.ones(2)] * 3)
