"""Row-sparse push_pull on the worker without a job: the checks, sums by id, placement, records and merge."""

import json

import numpy as np
import pytest

from byteps.common.dtypes import DType
from byteps.common.engine.route import SPARSE_ROUTE
from byteps.common.engine.sparse_exchange import SparseExchange, table_spec
from byteps.common.engine.sparse_task import SparseTasks, SparseTrip, average_rows
from byteps.common.options import MAX_PROCESS_SET_ID
from byteps.common.row_sparse import (
    decode,
    encode,
    encode_chunks,
    is_sparse_key,
    server_of,
    sparse_dtype,
    sparse_key,
    sum_by_id,
)
from byteps.common.tensor_registry import TensorRegistry


def test_rows_of_one_id_are_summed_and_ids_sorted():
    ids, rows = sum_by_id(np.array([9, 2, 9, 2, 5]), np.array([[1.0], [2.0], [3.0], [4.0], [5.0]], np.float32))
    assert ids.tolist() == [2, 5, 9] and rows[:, 0].tolist() == [6, 5, 4]
    empty_ids, empty_rows = sum_by_id(np.array([], np.int64), np.zeros((0, 3), np.float16))
    assert empty_ids.dtype == np.int64 and empty_rows.shape == (0, 3)


def test_float16_rows_of_one_id_are_summed_in_float32():
    _, rows = sum_by_id(np.array([1, 1, 1]), np.array([[2048], [1], [1]], np.float16))
    assert rows.dtype == np.float16 and rows[0, 0] == 2050


def bf16(values) -> np.ndarray:
    """float32 values (exact in bfloat16) as bfloat16 storage."""
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def test_bfloat16_rows_of_one_id_are_summed_in_float32_and_rounded_once():
    # 256 + 1 + 1 in bfloat16 one by one stays 256 (its spacing there is 2); in float32 it is 258, exact in bf16
    ids, rows = sum_by_id(np.array([1, 1, 1, 0]), bf16([[256], [1], [1], [3]]), DType.BFLOAT16)
    assert ids.tolist() == [0, 1] and rows.dtype == np.uint16 and rows[:, 0].tolist() == bf16([3, 258]).tolist()
    assert sparse_dtype("bfloat16") is DType.BFLOAT16 and sparse_dtype(np.float16) is DType.FLOAT16
    with pytest.raises(ValueError, match=r"rows of dtype uint16: .* \(bfloat16 as dtype='bfloat16'"):
        sparse_dtype(np.uint16)  # 16-bit integers are not taken for bfloat16 unless asked


def test_bfloat16_rows_are_given_by_name_over_16_bit_storage_and_averaged_in_float32():
    tasks = SparseTasks(0, 1, 1 << 20, None)
    ids, rows = tasks.make(np.array([4, 4, 1]), bf16([[1, 2], [1, 2], [3, 3]]).view(np.int16), "emb", 10, 2,
                           average=True, dtype="bfloat16").wait()
    assert ids.tolist() == [1, 4] and rows.dtype == np.uint16 and rows.tolist() == bf16([[3, 3], [2, 4]]).tolist()
    with pytest.raises(ValueError, match="bfloat16 rows must be stored in 16 bits, not as float32"):
        tasks.make(np.array([1]), np.ones((1, 2), np.float32), "emb2", 10, 2, average=False, dtype="bfloat16")
    assert average_rows(bf16([[3, 6]]), 3, DType.BFLOAT16).tolist() == bf16([[1, 2]]).tolist()


def test_rows_spread_over_the_servers_alike_everywhere():
    ids = np.arange(100_000)
    owners = server_of(ids, 4)
    assert np.array_equal(owners, server_of(ids.copy(), 4))
    counts = np.bincount(owners, minlength=4)
    assert counts.min() > 0.95 * counts.max(), counts  # a contiguous range spreads evenly
    hot = server_of(np.arange(16), 4)  # the hottest rows of a power law are not all on one server
    assert len(set(hot.tolist())) == 4
    assert server_of(ids, 1).tolist() == [0] * len(ids)


def test_records_go_and_come_back_whole():
    ids, rows = np.array([3, 8], np.int64), np.arange(12, dtype=np.float64).reshape(2, 2, 3)
    back_ids, back_rows = decode(encode(ids, rows), (2, 3), DType.FLOAT64)
    assert back_ids.tolist() == [3, 8] and np.array_equal(back_rows, rows)
    assert [a.shape for a in decode(None, (2, 3), DType.FLOAT64)] == [(0,), (0, 2, 3)]
    with pytest.raises(ValueError, match="not a whole number"):
        decode(b"\0" * 10, (2, 3), DType.FLOAT64)


def test_a_sparse_key_never_meets_a_dense_one():
    assert is_sparse_key(sparse_key(5, 3)) and sparse_key(5, 3) & 0xFFFFFFFFFFFF == 5 << 16 | 3
    registry = TensorRegistry(None)
    dense = [registry.declare("w")]
    dense += [registry.derived_id("w", 63), TensorRegistry.reserved_id(7), MAX_PROCESS_SET_ID << 32 | 12345]
    assert not any(is_sparse_key(tensor_id << 16 | 0xFFFF) for tensor_id in dense), dense


class Recorder:
    def __init__(self):
        self.tasks = []

    def __call__(self, task):
        self.tasks.append(task)


def test_a_call_becomes_one_share_per_server_with_duplicates_summed():
    submit = Recorder()
    tasks = SparseTasks(3, 4, 1 << 20, submit)
    ids = np.array([0, 1, 2, 3, 4, 5, 6, 7, 1])
    rows = np.ones((9, 2), np.float32)
    handle = tasks.make(ids, rows, "emb", 100, (2,), average=True)
    task, = submit.tasks
    assert task.round == 0 and task.average_over == 4 and [s.server for s in task.plan.partitions] == [0, 1, 2]
    pushed = {}
    for shard in task.plan.partitions:
        payload, = shard.payloads
        shard_ids, shard_rows = decode(payload, (2,), DType.FLOAT32)
        assert np.all(server_of(shard_ids, 3) == shard.server) and shard.key == sparse_key(0, shard.server)
        pushed.update(zip(shard_ids.tolist(), shard_rows[:, 0].tolist()))
    assert pushed == {0: 1, 1: 2, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1}
    with pytest.raises(ValueError, match="in flight"):  # one push_pull per table at a time; no round is taken
        tasks.make(ids, rows, "emb", 100, (2,), average=True)
    handle.set_done()
    tasks.make(ids, rows, "emb", 100, (2,), average=True)
    assert submit.tasks[-1].round == 1
    assert table_spec(task, 2).to_json() == {"name": "emb", "partition": 2, "shape": [100, 2], "tensor_nbytes": 800,
                                             "nbytes": 8, "dtype": 0, "sparse": True}


@pytest.mark.parametrize("ids,rows,row_shape,text", [
    ([1, 100], np.ones((2, 2), np.float32), (2,), r"row ids must lie in \[0, 100\); got 100"),
    ([-3], np.ones((1, 2), np.float32), (2,), "got -3"),
    ([1.5], np.ones((1, 2), np.float32), (2,), "1-D integer array"),
    ([[1]], np.ones((1, 2), np.float32), (2,), "1-D integer array"),
    ([1], np.ones((1, 2), np.int32), (2,), "push_pull takes float32, float64, float16"),
    ([1], np.ones((1, 3), np.float32), (2,), r"rows of shape \(1, 3\) for 1 ids"),
    ([1, 2], np.ones((1, 2), np.float32), (2,), r"rows of shape \(1, 2\) for 2 ids"),
    ([1], np.ones((1, 2), np.float32), (0,), "positive sizes"),
])
def test_bad_input_is_refused_here_and_its_round_failed_on_the_servers(ids, rows, row_shape, text):
    submit = Recorder()
    tasks = SparseTasks(2, 2, 1 << 20, submit)
    with pytest.raises(ValueError, match=text):
        tasks.make(np.array(ids), rows, "emb", 100, row_shape, average=False)
    refusal, = submit.tasks
    assert refusal.round == 0 and isinstance(refusal.refusal, ValueError)
    assert [s.key for s in refusal.plan.partitions] == [sparse_key(0, 0), sparse_key(0, 1)]
    tasks.make(np.array([1]), np.ones((1, 2), np.float32), "emb", 100, (2,), average=False)
    assert submit.tasks[-1].round == 1  # the next call is the table's next round, as on the other ranks


def test_a_table_keeps_its_layout_and_its_id_from_its_first_use():
    submit = Recorder()
    tasks = SparseTasks(1, 2, 1 << 20, submit)
    with pytest.raises(ValueError, match="positive number of rows"):
        tasks.make(np.array([1]), np.ones((1, 2), np.float32), "first", 0, (2,), average=False)
    tasks.make(np.array([1]), np.ones((1, 2), np.float32), "second", 10, (2,), average=False).set_done()
    assert submit.tasks[-1].plan.tensor_id == 1  # "first" took id 0, refused as it was
    for num_rows, rows, row_shape in [(11, np.ones((1, 2), np.float32), (2,)), (10, np.ones((1, 2), np.float64), (2,)),
                                      (10, np.ones((1, 1, 2), np.float32), (1, 2))]:
        with pytest.raises(ValueError, match="the name was first used for row-sparse table 'second' "
                                             r"\(10 rows of shape 2, float32\)"):
            tasks.make(np.array([1]), rows, "second", num_rows, row_shape, average=False)
    with pytest.raises(ValueError, match="non-empty name"):
        tasks.make(np.array([1]), np.ones((1, 2), np.float32), "", 10, (2,), average=False)


def test_after_a_join_a_rank_adopts_the_tables_and_rounds_it_missed():
    one = np.ones((1, 2), np.float32)
    early, late = (SparseTasks(1, 2, 1 << 20, Recorder()) for _ in range(2))
    for tasks in (early, late):
        tasks.make(np.array([1]), one, "emb", 10, (2,), average=False).set_done()
    for _ in range(2):  # the early rank has joined: the late one goes on, and uses a table of its own
        late.make(np.array([1]), one, "emb", 10, (2,), average=False).set_done()
    late.make(np.array([1]), one, "tail", 5, (2,), average=False).set_done()
    states = json.loads(json.dumps([early.export(), late.export()]))  # as agree_after_join carries them
    for tasks in (early, late):
        tasks.adopt(states)
        assert {name: (t.table_id, t.rounds, t.num_rows) for name, t in tasks.tables.items()} == \
            {"emb": (0, 3, 10), "tail": (1, 1, 5)}
        tasks.make(np.array([1]), one, "late", 10, (2,), average=False).set_done()
        assert tasks.tables["late"].table_id == 2  # a new table takes the same id on every rank again
    other = SparseTasks(1, 2, 1 << 20, Recorder())
    other.make(np.array([1]), one, "tail", 5, (2,), average=False).set_done()
    with pytest.raises(RuntimeError, match="has id 0 here and 1 on another rank"):
        other.adopt(states)


def test_one_server_s_share_larger_than_a_message_goes_in_parts_of_whole_records():
    submit = Recorder()
    tasks = SparseTasks(1, 2, 100, submit)  # 16-byte records: 6 a message
    tasks.make(np.arange(10)[::-1], np.arange(20, dtype=np.float32).reshape(10, 2), "emb", 100, (2,), average=False)
    shard, = submit.tasks[0].plan.partitions
    parts = [decode(payload, (2,), DType.FLOAT32) for payload in shard.payloads]
    assert [part[0].tolist() for part in parts] == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9]]
    assert np.concatenate([part[1] for part in parts])[:, 0].tolist() == [18, 16, 14, 12, 10, 8, 6, 4, 2, 0]
    assert encode_chunks(np.array([], np.int64), np.zeros((0, 2), np.float32), 100, "t") == [None]
    with pytest.raises(ValueError, match="one .id, row. record is 16 bytes, more than one message carries"):
        SparseTasks(1, 2, 8, Recorder()).make(np.arange(2), np.ones((2, 2), np.float32), "emb", 100, (2,),
                                               average=False)


def test_a_single_process_gets_its_own_rows_summed():
    tasks = SparseTasks(0, 1, 1 << 20, None)
    ids, rows = tasks.make(np.array([4, 4, 1]), np.ones((3, 2), np.float16), "emb", 10, 2, average=True).wait()
    assert ids.tolist() == [1, 4] and rows.tolist() == [[1, 1], [2, 2]] and rows.dtype == np.float16


def test_the_servers_unions_are_merged_by_id_and_averaged():
    submit = Recorder()
    tasks = SparseTasks(2, 4, 1 << 20, submit)
    handle = tasks.make(np.array([1]), np.ones((1, 2), np.float32), "emb", 100, (2,), average=True)
    task, = submit.tasks
    merge = SparseExchange([], 0).merge
    answers = {0: (np.array([2, 9]), np.full((2, 2), 8, np.float32)), 1: (np.array([1, 5]), np.full((2, 2), 4.0))}
    for server, answer in answers.items():
        trip = SparseTrip(task, task.plan.partitions[server], SPARSE_ROUTE)
        trip.data = [(answer[0], answer[1].astype(np.float32))]  # an answer of one part
        merge(trip)
    handle.set_done()
    ids, rows = handle.wait()
    assert ids.tolist() == [1, 2, 5, 9] and rows[:, 0].tolist() == [1, 2, 1, 2]
