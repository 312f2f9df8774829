"""The fusion planner (pure) and the grouped push_pull with one worker alone.

Real jobs with servers: test_fusion_job.py.
"""

import numpy as np
import pytest

import byteps.common as bps
from byteps.common import Config, DType, Worker
from byteps.common.fusion import BUCKET_PREFIX, bucket_name, plan_fusion, push_pull_group_async

F32, F16, I64 = DType.FLOAT32, DType.FLOAT16, DType.INT64


def members(groups):
    return [g.members for g in groups]


def test_small_tensors_fill_buckets_in_order_up_to_the_threshold():
    items = [(f"t{i}", 40, F32) for i in range(7)]
    groups = plan_fusion(items, threshold=100, max_tensor_bytes=64)
    assert members(groups) == [(0, 1), (2, 3), (4, 5), (6,)]
    assert [g.offsets for g in groups] == [(0, 40), (0, 40), (0, 40), (0,)]
    assert [g.nbytes for g in groups] == [80, 80, 80, 40]
    assert all(g.fused for g in groups[:3]) and not groups[3].fused  # a bucket of one goes alone
    assert groups[3].name is None


def test_exactly_the_threshold_fits():
    groups = plan_fusion([("a", 50, F32), ("b", 50, F32), ("c", 1, F32)], threshold=100, max_tensor_bytes=100)
    assert members(groups) == [(0, 1), (2,)]


def test_large_tensors_go_alone_and_do_not_close_the_open_bucket():
    items = [("w0", 1000, F32), ("b0", 8, F32), ("w1", 1000, F32), ("b1", 8, F32), ("ln", 65, F32)]
    groups = plan_fusion(items, threshold=4096, max_tensor_bytes=64)
    assert members(groups) == [(0,), (1, 3), (2,), (4,)]
    assert [g.fused for g in groups] == [False, True, False, False]
    assert groups[1].offsets == (0, 8)


def test_a_tensor_above_the_threshold_is_never_fused_even_under_max_tensor_bytes():
    groups = plan_fusion([("a", 8, F32), ("big", 200, F32), ("b", 8, F32)], threshold=100, max_tensor_bytes=1000)
    assert members(groups) == [(0, 2), (1,)]


def test_each_dtype_has_its_own_buckets():
    items = [("a", 8, F32), ("h", 4, F16), ("b", 8, F32), ("i", 16, I64), ("k", 4, F16), ("j", 16, I64)]
    groups = plan_fusion(items, threshold=1000, max_tensor_bytes=100)
    assert members(groups) == [(0, 2), (1, 4), (3, 5)]
    assert [g.dtype for g in groups] == [F32, F16, I64]
    assert [g.nbytes for g in groups] == [16, 8, 32]


def test_compressed_tensors_fuse_apart_in_buckets_of_one_partition():
    # a, c, e compressed (1000 bytes each: above max_tensor_bytes, under the 2500-byte partition); b, d small
    items = [("a", 1000, F32), ("b", 8, F32), ("c", 1000, F32), ("d", 8, F32), ("e", 1000, F32), ("f", 3000, F32)]
    flags = [True, False, True, False, True, True]
    groups = plan_fusion(items, threshold=4096, max_tensor_bytes=64, compressed=flags, partition_bytes=2500)
    assert members(groups) == [(0, 2), (1, 3), (4,), (5,)]
    assert [(g.fused, g.compressed) for g in groups] == [(True, True), (True, False), (False, True), (False, True)]
    assert groups[0].nbytes == 2000  # a third member would take the bucket past one partition
    # without a partition size (or with fusion off) compressed tensors go alone
    assert members(plan_fusion(items, 4096, 64, flags)) == [(0,), (1, 3), (2,), (4,), (5,)]
    assert members(plan_fusion(items, 0, 64, flags, 2500)) == [(i,) for i in range(6)]
    with pytest.raises(ValueError, match="6 items but 2 compressed flags"):
        plan_fusion(items, 4096, 64, [True, False], 2500)


def test_dtype_names_and_enums_plan_alike():
    by_name = plan_fusion([("a", 8, "float32"), ("b", 8, "float32")], 100, 100)
    by_enum = plan_fusion([("a", 8, F32), ("b", 8, F32)], 100, 100)
    assert by_name == by_enum


def test_threshold_zero_disables_fusion():
    items = [(f"t{i}", 4, F32) for i in range(5)]
    groups = plan_fusion(items, threshold=0, max_tensor_bytes=65536)
    assert members(groups) == [(i,) for i in range(5)] and not any(g.fused for g in groups)


def test_negative_thresholds_are_errors():
    with pytest.raises(ValueError, match=">= 0"):
        plan_fusion([("a", 4, F32)], threshold=-1, max_tensor_bytes=10)


def test_every_tensor_is_planned_exactly_once():
    rng = np.random.default_rng(0)
    items = [(f"t{i}", int(rng.integers(1, 300)), [F32, F16, I64][i % 3]) for i in range(500)]
    groups = plan_fusion(items, threshold=1024, max_tensor_bytes=200)
    planned = sorted(i for g in groups for i in g.members)
    assert planned == list(range(500))
    for g in groups:
        assert g.nbytes == sum(items[i][1] for i in g.members)
        assert g.nbytes <= 1024 or not g.fused
        assert len({items[i][2] for i in g.members}) == 1
        assert list(g.members) == sorted(g.members)
    assert [g.members[0] for g in groups] == sorted(g.members[0] for g in groups)


def test_plans_are_deterministic_and_names_encode_membership():
    items = [(f"layer{i}.bias", 16 + i, F32) for i in range(50)]
    first, second = plan_fusion(items, 512, 64), plan_fusion(list(items), 512, 64)
    assert first == second
    names = [g.name for g in first if g.fused]
    assert len(set(names)) == len(names)
    assert names[0].startswith(BUCKET_PREFIX + "layer0.bias+")
    # one member renamed, resized or retyped: another bucket name
    renamed = [("other", 16, F32)] + items[1:]
    resized = [("layer0.bias", 20, F32)] + items[1:]
    retyped = [("layer0.bias", 16, DType.INT32)] + items[1:]
    for changed in (renamed, resized, retyped):
        assert plan_fusion(changed, 512, 64)[0].name != first[0].name


def test_replanning_one_bucket_gives_the_same_bucket():
    items = [(f"p{i}", 100, F32) for i in range(30)]
    for group in plan_fusion(items, 1000, 200):
        again = plan_fusion([items[i] for i in group.members], 1000, 200)
        assert len(again) == 1 and again[0].name == group.name


def test_bucket_name_shape():
    name = bucket_name(["a", "b"], [4, 8], [F32, F32])
    prefix, digest = name.rsplit(":", 1)
    assert prefix == "fused:a+2" and len(digest) == 12


# --- the grouped call with one worker process (no server: push_pull is a copy) --------------


@pytest.fixture
def worker():
    w = Worker(Config.from_env({}))
    yield w
    w.shutdown()


def test_single_worker_group_is_identity_in_place_and_out_of_place(worker):
    tensors = [np.arange(n, dtype=dtype) for n, dtype in [(3, np.float32), (5, np.int64), (2, np.float16)]]
    handles = push_pull_group_async(worker, tensors, ["a", "b", "c"])
    assert [h.wait() is t for h, t in zip(handles, tensors)] == [True] * 3
    outputs = [np.zeros_like(t) for t in tensors]
    for h in push_pull_group_async(worker, tensors, ["a", "b", "c"], average=False, outputs=outputs):
        h.wait()
    assert all(np.array_equal(o, t) for o, t in zip(outputs, tensors))


def test_group_argument_errors(worker):
    x = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="2 tensors but 1 names"):
        push_pull_group_async(worker, [x, x.copy()], ["a"])
    with pytest.raises(ValueError, match="appears twice"):
        push_pull_group_async(worker, [x, x.copy()], ["a", "a"])
    with pytest.raises(ValueError, match="non-empty string"):
        push_pull_group_async(worker, [x], [""])
    with pytest.raises(ValueError, match="output has 8 bytes"):
        push_pull_group_async(worker, [x], ["a"], outputs=[np.zeros(2, np.float32)])


def test_module_api_returns_integer_handles(monkeypatch):
    for variable in ("DMLC_ROLE", "DMLC_NUM_WORKER", "BYTEPS_FORCE_DISTRIBUTED"):
        monkeypatch.delenv(variable, raising=False)
    bps.init(Config.from_env({}))
    try:
        tensors = [np.full(4, float(i), np.float32) for i in range(3)]
        ids = bps.push_pull_group_async(tensors, [f"g{i}" for i in range(3)])
        assert all(isinstance(i, int) for i in ids)
        assert [float(bps.synchronize(i)[0]) for i in ids] == [0.0, 1.0, 2.0]
    finally:
        bps.shutdown()
