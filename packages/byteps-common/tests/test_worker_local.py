"""The worker API with one worker process: no scheduler, no server (as in BytePS)."""

import numpy as np
import pytest

import byteps.common as bps
from byteps.common import Config, PushPullOptions, Worker


@pytest.fixture
def worker():
    w = Worker(Config.from_env({}))
    yield w
    w.shutdown()


def test_single_worker_push_pull_is_identity(worker):
    x = np.arange(10, dtype=np.float32)
    assert worker.push_pull(x, "x") is x and np.array_equal(x, np.arange(10))
    out = np.empty_like(x)
    worker.push_pull(x, "y", PushPullOptions(output=out, average=False))
    assert np.array_equal(out, x)
    assert (worker.rank, worker.size, worker.is_distributed) == (0, 1, False)


def test_names_get_ids_in_declaration_order(worker):
    assert [worker.declare(n) for n in ("a", "b", "a", "c")] == [0, 1, 0, 2]
    with pytest.raises(ValueError, match="non-empty string"):
        worker.declare("")


def test_bad_inputs_are_clear_errors(worker):
    with pytest.raises(ValueError, match="not contiguous"):
        worker.push_pull(np.zeros((4, 4), np.float32)[:, 1], "t")
    with pytest.raises(ValueError, match="unsupported dtype 'uint8'"):
        worker.push_pull(np.zeros(4, np.uint8), "t")
    with pytest.raises(ValueError, match="read-only"):
        worker.push_pull(b"\0" * 16, "t", PushPullOptions(dtype="float32"))
    with pytest.raises(ValueError, match="output has 8 bytes"):
        worker.push_pull(np.zeros(4, np.float32), "t", PushPullOptions(output=np.zeros(2, np.float32)))
    with pytest.raises(ValueError, match="dtype=float64 needs 8-byte elements"):
        worker.push_pull(np.zeros(4, np.float32), "t", PushPullOptions(dtype="float64"))
    with pytest.raises(ValueError, match="neither a numpy array, a buffer nor a DLPack"):
        worker.push_pull(object(), "t")


def test_buffer_protocol_and_dlpack_inputs(worker):
    data = bytearray(np.arange(4, dtype=np.int32).tobytes())
    out = worker.push_pull(memoryview(data).cast("i"), "mv")
    assert out.tolist() == [0, 1, 2, 3]

    class DLPackOnly:
        def __init__(self, array):
            self.array = array

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    src = np.ones(3, dtype=np.float64)
    assert worker.push_pull(DLPackOnly(src), "dl", PushPullOptions(output=np.zeros(3))).tolist() == [1, 1, 1]


def test_bfloat16_over_uint16_storage(worker):
    bits = np.array([0x3F80, 0x4000], dtype=np.uint16)  # 1.0, 2.0
    assert worker.push_pull(bits, "bf", PushPullOptions(dtype="bfloat16")) is bits


def test_module_api_handles():
    bps.init(Config.from_env({}))
    try:
        x = np.ones(5, np.float64)
        handle = bps.push_pull_async(x, name="h")
        assert bps.poll(handle) is True
        assert bps.synchronize(handle) is x
        with pytest.raises(ValueError, match="unknown push_pull handle"):
            bps.poll(handle)
        assert (bps.rank(), bps.size(), bps.local_rank(), bps.local_size()) == (0, 1, 0, 1)
    finally:
        bps.shutdown()
    assert not bps.is_initialized()
    with pytest.raises(ValueError, match="call init"):
        bps.rank()


def test_done_callbacks_run_once_with_the_handle(worker):
    seen = []
    handle = worker.push_pull_async(np.ones(3, np.float32), "cb")
    handle.add_done_callback(lambda h: seen.append(("late", h.error)))
    assert seen == [("late", None)]  # already done: runs at once


def test_callbacks_of_a_failed_handle_see_the_error_and_a_raising_callback_is_contained():
    from byteps.common.handle import Handle, PushPullError

    handle = Handle("x", output=None)
    seen = []
    handle.add_done_callback(lambda h: 1 / 0)
    handle.add_done_callback(lambda h: seen.append(h.error))
    handle.set_error(RuntimeError("server gone"))
    handle.set_done()  # a second completion is ignored
    assert len(seen) == 1 and str(seen[0]) == "server gone"
    with pytest.raises(PushPullError, match="server gone"):
        handle.wait()
