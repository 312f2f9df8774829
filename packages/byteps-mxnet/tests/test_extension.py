"""byteps.mxnet._C on its own: DLPack views of NDArrays, and ops on MXNet's engine.

These tests drive the ready queue by hand instead of byteps' submitter
thread, so byteps.mxnet must not be initialised while they run.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")
bps = pytest.importorskip("byteps.mxnet")
from byteps.mxnet import _C  # noqa: E402

CODES = {"float32": 0, "float64": 1, "float16": 2, "int32": 4, "int64": 5}


@pytest.fixture(autouse=True)
def not_initialised():
    bps.shutdown()
    yield
    _C.close_ready_queue("test over")


@pytest.mark.parametrize("dtype", list(CODES))
def test_from_dlpack_views_the_arrays_memory(dtype):
    x = mx.nd.array(np.arange(6).reshape(2, 3), dtype=dtype)
    view, code, shape = _C.from_dlpack(x.to_dlpack_for_write())
    assert (code, shape, view.nbytes, view.readonly) == (CODES[dtype], (2, 3), 6 * np.dtype(dtype).itemsize, False)
    array = np.frombuffer(view, dtype=dtype).reshape(shape)
    np.testing.assert_array_equal(array, np.arange(6).reshape(2, 3))
    array[1, 2] = 42
    assert x.asnumpy()[1, 2] == 42


def test_from_dlpack_keeps_the_memory_alive():
    x = mx.nd.ones((1000,)) * 7
    view, _, _ = _C.from_dlpack(x.to_dlpack_for_read())
    del x
    gc.collect()
    mx.nd.waitall()
    assert np.frombuffer(view, dtype=np.float32).sum() == 7000


def test_from_dlpack_of_zero_dimensional_and_empty_arrays():
    with mx.util.np_shape(True):
        scalar = mx.nd.array(np.array(2.5, dtype=np.float32))
        empty = mx.nd.array(np.zeros((0, 3), dtype=np.float32))
    view, _, shape = _C.from_dlpack(scalar.to_dlpack_for_read())
    assert shape == () and np.frombuffer(view, dtype=np.float32)[0] == 2.5
    view, _, shape = _C.from_dlpack(empty.to_dlpack_for_read())
    assert shape == (0, 3) and view.nbytes == 0


def test_from_dlpack_refusals_leave_the_capsule_usable():
    x = mx.nd.ones((3,), dtype="uint8")
    capsule = x.to_dlpack_for_read()
    with pytest.raises(ValueError, match="unsupported dtype uint8: byteps reduces float16"):
        _C.from_dlpack(capsule)
    assert mx.nd.from_dlpack(capsule).asnumpy().tolist() == [1, 1, 1]   # still a fresh 'dltensor'
    with pytest.raises(ValueError, match="consumed only once"):
        _C.from_dlpack(capsule)
    with pytest.raises(TypeError, match="expected a DLPack capsule"):
        _C.from_dlpack(x)


def _push(op_id, reads, writes, name="test"):
    token = mx.nd.zeros((1,))
    rc = _C.push(op_id, [a.handle.value for a in reads], [a.handle.value for a in writes], [token.handle.value],
                 0, name)
    assert rc == 0
    return token


def test_an_engine_op_orders_mxnet_ops_around_it():
    _C.open_ready_queue()
    x = mx.nd.ones((4,))
    x += 1                                   # pending write before the op
    _push(1, [], [x])
    y = x * 10                               # issued before the op can finish
    op = _C.next_ready(10.0)
    assert op is not None and op.id == 1 and op.name == "test" and not op.done
    (view, code, shape), = op.views()
    array = np.frombuffer(view, dtype=np.float32)
    np.testing.assert_array_equal(array, [2, 2, 2, 2])  # the pending write happened first
    assert not op.wait(0.05)                 # the end op waits for finish()
    array[:] = [5, 6, 7, 8]
    op.finish()
    np.testing.assert_array_equal(y.asnumpy(), [50, 60, 70, 80])  # the later op saw the result
    with pytest.raises(RuntimeError, match="already taken"):
        op.views()


def test_an_engine_op_reads_its_inputs_and_writes_its_outputs():
    _C.open_ready_queue()
    source, output = mx.nd.arange(3), mx.nd.zeros((3,))
    _push(2, [source], [output])
    source += 100                            # a later write waits for the op to finish
    op = _C.next_ready(10.0)
    (inp, _, _), (out, _, _) = op.views()
    np.frombuffer(out, dtype=np.float32)[:] = np.frombuffer(inp, dtype=np.float32) * 2
    op.finish()
    np.testing.assert_array_equal(output.asnumpy(), [0, 2, 4])
    np.testing.assert_array_equal(source.asnumpy(), [100, 101, 102])


def test_a_failed_op_is_raised_by_mxnet_from_the_read():
    _C.open_ready_queue()
    x = mx.nd.ones((2,))
    _push(3, [], [x])
    op = _C.next_ready(10.0)
    op.finish("push_pull('x') failed: boom")
    with pytest.raises(mx.base.MXNetError, match=r"push_pull\('x'\) failed: boom"):
        x.wait_to_read()
    z = mx.nd.ones((2,)) + 1                 # the engine goes on
    assert z.asnumpy().tolist() == [2, 2]


def test_closing_the_queue_fails_waiting_and_later_ops():
    _C.open_ready_queue()
    queued = mx.nd.ones((2,))
    _push(4, [], [queued])                   # ready at once: waits in the queue
    gate = mx.nd.ones((2,))
    _push(5, [], [gate])
    first = _C.next_ready(10.0)
    assert first.id == 4
    _C.close_ready_queue("shut down for the test")
    assert _C.next_ready(0.1) is None
    later = mx.nd.ones((2,))
    _push(6, [], [later])                    # after close: fails as soon as it is ready
    with pytest.raises(mx.base.MXNetError, match="shut down for the test"):
        gate.wait_to_read()
    with pytest.raises(mx.base.MXNetError, match="shut down for the test"):
        later.wait_to_read()
    first.finish()
    queued.wait_to_read()


def test_views_refuse_unsupported_dtypes():
    _C.open_ready_queue()
    x = mx.nd.ones((2,), dtype="uint8")
    _push(7, [], [x])
    op = _C.next_ready(10.0)
    with pytest.raises(ValueError, match="unsupported dtype uint8"):
        op.views()
    op.finish("refused")
    with pytest.raises(mx.base.MXNetError, match="refused"):
        x.wait_to_read()


def test_an_elastic_script_fails_at_hvd_elastic_naming_what_to_do_instead():
    for name in ("run", "ObjectState", "MXNetState"):
        with pytest.raises(NotImplementedError, match=r"--max-restarts .*byteps\.torch\.elastic"):
            getattr(bps.elastic, name)
