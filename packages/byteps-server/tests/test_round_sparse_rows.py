"""SparseRowSum, a row-sparse table's rows on one server, driven directly (no sockets, see round_driver.py)."""

import numpy as np
import pytest
from round_driver import RoundDriver

from byteps.common.dtypes import DType
from byteps.common.row_sparse import decode, encode, sparse_key
from byteps.common.tensor_description import PartitionSpec
from byteps.server.rounds import SparseRowSum
from byteps.transport import Command
from byteps.transport.frames import FLAG_AVERAGE, FLAG_PULL

KEY = sparse_key(0, 0)
ROW = (2,)


def table_spec(num_rows: int = 10, dtype: DType = DType.FLOAT32, server: int = 0) -> PartitionSpec:
    row_nbytes = 2 * dtype.itemsize
    return PartitionSpec(name="emb", partition=server, shape=(num_rows, *ROW), tensor_nbytes=num_rows * row_nbytes,
                         nbytes=row_nbytes, dtype=int(dtype), sparse=True)


def records(ids, values, dtype=np.float32):
    return encode(np.asarray(ids, np.int64), np.asarray(values, dtype).reshape(len(ids), *ROW)).tobytes()


def push(server: RoundDriver, rank: int, round_: int, ids, values, flags: int = FLAG_PULL, dtype=np.float32):
    """A sparse push that carries its pull, as the server hands both to the policy."""
    server.push(KEY, rank, round_, payload=records(ids, values, dtype), flags=flags)
    if flags & FLAG_PULL:
        server.pull(KEY, rank, round_)


def answers(server: RoundDriver, dtype: DType = DType.FLOAT32):
    return {s.to: tuple(a.tolist() for a in decode(s.payload, ROW, dtype)) for s in server.take(Command.PULL_RESPONSE)}


def test_a_round_sums_every_machine_s_rows_by_id_and_answers_the_union_to_all():
    server = RoundDriver(machines=3)
    policy = server.declare(KEY, table_spec())
    assert isinstance(policy, SparseRowSum)
    push(server, 0, 0, [1, 4], [[1, 1], [4, 4]])
    push(server, 1, 0, [], [])  # nothing this round
    assert server.take(Command.PULL_RESPONSE) == [] and policy.partial_round().pushed_ranks == {0, 1}
    push(server, 2, 0, [0, 4, 9], [[10, 10], [40, 40], [90, 90]])
    union = ([0, 1, 4, 9], [[10, 10], [1, 1], [44, 44], [90, 90]])
    assert answers(server) == {0: union, 1: union, 2: union}
    assert policy.answer is None and policy.partial_round() is None  # nothing of the round is kept
    push(server, 2, 1, [3], [[3, 3]])  # the next round starts clean
    push(server, 0, 1, [], [])
    push(server, 1, 1, [], [])
    assert answers(server) == {r: ([3], [[3, 3]]) for r in range(3)}


def test_a_round_of_no_rows_anywhere_is_answered_with_none():
    server = RoundDriver(machines=2)
    server.declare(KEY, table_spec())
    push(server, 0, 0, [], [])
    push(server, 1, 0, [], [])
    sent = server.take(Command.PULL_RESPONSE)
    assert [(s.to, s.payload) for s in sent] == [(0, None), (1, None)]


def test_float16_rows_are_summed_in_float32_and_rounded_once():
    server = RoundDriver(machines=3)
    server.declare(KEY, table_spec(dtype=DType.FLOAT16))
    # 2048 + 1 + 1 in float16 one by one stays 2048 (its spacing there is 2); in float32 it is 2050
    for rank, value in enumerate([2048, 1, 1]):
        push(server, rank, 0, [5], [[value, value]], dtype=np.float16)
    assert answers(server, DType.FLOAT16)[0] == ([5], [[2050, 2050]])


def test_bfloat16_rows_are_summed_in_float32_and_rounded_once():
    server = RoundDriver(machines=3)
    server.declare(KEY, table_spec(dtype=DType.BFLOAT16))
    bf16 = lambda v: (np.asarray(v, np.float32).view(np.uint32) >> 16).astype(np.uint16)  # noqa: E731
    # 256 + 1 + 1 in bfloat16 one by one stays 256 (its spacing there is 2); in float32 it is 258
    for rank, value in enumerate([256, 1, 1]):
        server.push(KEY, rank, 0, payload=encode(np.array([5], np.int64), bf16([[value, value]])).tobytes(),
                    flags=FLAG_PULL)
        server.pull(KEY, rank, 0)
    sent = server.take(Command.PULL_RESPONSE)
    ids, rows = decode(sent[0].payload, ROW, DType.BFLOAT16)
    assert ids.tolist() == [5] and rows.tolist() == bf16([[258, 258]]).tolist() and len(sent) == 3


@pytest.mark.parametrize("ids,values,text", [
    ([3, 1], [[1, 1], [1, 1]], "not unique and ascending"),
    ([2, 2], [[1, 1], [1, 1]], "not unique and ascending"),
    ([10], [[1, 1]], r"outside \[0, 10\)"),
    ([-1], [[1, 1]], r"outside \[0, 10\)"),
])
def test_a_bad_push_fails_the_round_on_every_machine_and_the_next_round_goes_on(ids, values, text):
    server = RoundDriver(machines=3)
    server.declare(KEY, table_spec())
    push(server, 0, 0, [1], [[1, 1]])
    with pytest.raises(ValueError, match=f"worker 1: .*{text}"):
        server.push(KEY, 1, 0, payload=records(ids, values), flags=FLAG_PULL)
    assert [s.to for s in server.take(Command.ERROR)] == [0]  # machine 0 pushed the round and waits on it
    with pytest.raises(ValueError, match=text):  # a late push of the failed round gets the same reason
        server.push(KEY, 2, 0, payload=records([1], [[1, 1]]), flags=FLAG_PULL)
    for rank in range(3):
        push(server, rank, 1, [rank], [[rank, rank]])
    assert answers(server)[2] == ([0, 1, 2], [[0, 0], [1, 1], [2, 2]])


def test_a_payload_of_no_whole_number_of_records_is_refused():
    server = RoundDriver(machines=2)
    server.declare(KEY, table_spec())
    with pytest.raises(ValueError, match="not a whole number of 16-byte"):
        server.push(KEY, 0, 0, payload=b"\0" * 17, flags=FLAG_PULL)


def test_a_push_must_carry_its_pull_and_come_once_per_machine():
    server = RoundDriver(machines=2)
    server.declare(KEY, table_spec())
    with pytest.raises(ValueError, match="part 1 of 1 .aux., without its pull"):  # fails round 0 everywhere
        server.push(KEY, 0, 0, payload=records([1], [[1, 1]]))
    assert server.take(Command.ERROR) == []  # nobody else pushed round 0; worker 0 hears of it from the raise
    push(server, 0, 1, [1], [[1, 1]])
    with pytest.raises(ValueError, match="second push of round 1"):
        server.push(KEY, 0, 1, payload=records([1], [[1, 1]]), flags=FLAG_PULL)
    with pytest.raises(ValueError, match="without its push"):
        server.pull(KEY, 1, 1)


def test_machines_that_average_and_sum_in_one_round_all_fail():
    server = RoundDriver(machines=3)
    server.declare(KEY, table_spec())
    push(server, 0, 0, [1], [[1, 1]], flags=FLAG_PULL | FLAG_AVERAGE)
    with pytest.raises(ValueError, match="worker 1 sums but worker 0 averages"):
        server.push(KEY, 1, 0, payload=records([1], [[1, 1]]), flags=FLAG_PULL)
    assert [s.to for s in server.take(Command.ERROR)] == [0]


def test_a_round_a_worker_failed_is_closed_and_one_pushed_past_is_skipped():
    server = RoundDriver(machines=2)
    policy = server.declare(KEY, table_spec())
    push(server, 0, 0, [1], [[1, 1]])
    policy.fail_round(0)  # worker 1 failed round 0 (the server told worker 0 with the worker's ERROR)
    assert policy.partial_round() is None
    push(server, 0, 1, [1], [[1, 1]])
    push(server, 1, 2, [2], [[2, 2]])  # worker 1 went on past round 1, which it failed: round 1 is off
    assert [(s.to, s.round) for s in server.take(Command.ERROR)] == [(0, 1)]
    push(server, 0, 2, [1], [[1, 1]])
    assert answers(server) == {r: ([1, 2], [[1, 1], [2, 2]]) for r in range(2)}


def answer_parts(server: RoundDriver):
    """Each machine's answer, part by part: {rank: [(aux, ids, rows), ...]}."""
    parts = {}
    for s in server.take(Command.PULL_RESPONSE):
        ids, rows = decode(s.payload, ROW, DType.FLOAT32)
        parts.setdefault(s.to, []).append((s.aux, ids.tolist(), rows.tolist()))
    return parts


def push_in_parts(server: RoundDriver, rank: int, round_: int, parts, flags: int = 0):
    """A push of several messages, each with their number in aux, the last one carrying the pull."""
    for index, (ids, values) in enumerate(parts):
        last = index == len(parts) - 1
        server.push(KEY, rank, round_, payload=records(ids, values), aux=len(parts),
                    flags=flags | (FLAG_PULL if last else 0))
    server.pull(KEY, rank, round_)


def test_an_answer_larger_than_a_message_goes_in_parts_of_whole_records():
    server = RoundDriver(machines=2)
    server.services.max_payload_bytes = 40  # two records of 16 bytes fit, three do not
    server.declare(KEY, table_spec())
    push(server, 0, 0, [1, 2], [[1, 1], [2, 2]])
    push(server, 1, 0, [2, 3], [[2, 2], [3, 3]])
    parts = [(2, [1, 2], [[1, 1], [4, 4]]), (2, [3], [[3, 3]])]
    assert answer_parts(server) == {0: parts, 1: parts}


def test_a_push_in_parts_is_summed_once_its_last_part_is_in():
    server = RoundDriver(machines=2)
    server.services.max_payload_bytes = 40
    policy = server.declare(KEY, table_spec())
    push_in_parts(server, 0, 0, [([1, 2], [[1, 1], [2, 2]]), ([5], [[5, 5]])])
    push(server, 1, 0, [2], [[2, 2]])
    parts = [(2, [1, 2], [[1, 1], [4, 4]]), (2, [5], [[5, 5]])]
    assert answer_parts(server) == {0: parts, 1: parts}
    server.push(KEY, 1, 1, payload=records([3], [[3, 3]]), aux=2)  # part 1 of 2: the round is open, not done
    assert policy.partial_round().pushed_ranks == {1}
    push(server, 0, 1, [4], [[4, 4]])
    assert server.take(Command.PULL_RESPONSE) == []  # machine 1's push is not whole yet
    server.push(KEY, 1, 1, payload=records([8], [[8, 8]]), aux=2, flags=FLAG_PULL)
    server.pull(KEY, 1, 1)
    assert answer_parts(server) == {r: [(2, [3, 4], [[3, 3], [4, 4]]), (2, [8], [[8, 8]])] for r in range(2)}


@pytest.mark.parametrize("parts,flags,text", [
    ([([2], [[2, 2]]), ([1], [[1, 1]])], [0, FLAG_PULL], "not unique and ascending across the push's parts"),
    ([([1], [[1, 1]]), ([2], [[2, 2]])], [FLAG_PULL, FLAG_PULL], "part 1 of 2 .aux., with its pull"),
    ([([1], [[1, 1]]), ([2], [[2, 2]])], [0, 0], "part 2 of 2 .aux., without its pull"),
])
def test_a_push_whose_parts_do_not_add_up_fails_the_round_everywhere(parts, flags, text):
    server = RoundDriver(machines=2)
    server.declare(KEY, table_spec())
    push(server, 1, 0, [7], [[7, 7]])
    with pytest.raises(ValueError, match=text):
        for (ids, values), flag in zip(parts, flags):
            server.push(KEY, 0, 0, payload=records(ids, values), aux=len(parts), flags=flag)
    assert [s.to for s in server.take(Command.ERROR)] == [1]  # worker 0 hears of it from the raise
    push(server, 0, 1, [1], [[1, 1]])  # the next round goes on
    push(server, 1, 1, [1], [[1, 1]])
    assert answers(server) == {r: ([1], [[2, 2]]) for r in range(2)}


def test_a_record_larger_than_a_message_fails_the_round():
    server = RoundDriver(machines=2)
    server.services.max_payload_bytes = 8  # a record (8-byte id, 8-byte row) never fits
    server.declare(KEY, table_spec())
    push(server, 0, 0, [1], [[1, 1]])
    with pytest.raises(ValueError, match="one .id, row. record is 16 bytes, more than one message carries"):
        push(server, 1, 0, [3], [[3, 3]])
    assert sorted(s.to for s in server.take(Command.ERROR)) == [0, 1]


def test_a_key_declared_to_another_server_than_its_rows_belong_to_is_refused():
    server = RoundDriver(machines=2)
    with pytest.raises(ValueError, match="another number of servers"):
        server.declare(KEY | 1, table_spec(server=1))


def test_a_sparse_description_must_be_consistent():
    with pytest.raises(ValueError, match="inconsistent"):
        PartitionSpec(name="emb", partition=0, shape=(10, 2), tensor_nbytes=80, nbytes=4, dtype=0,
                      sparse=True).check(1 << 20)
    with pytest.raises(ValueError, match="synchronous unless the servers hold it"):
        PartitionSpec(name="emb", partition=0, shape=(10, 2), tensor_nbytes=80, nbytes=8, dtype=0, sparse=True,
                      asynchronous=True).check(1 << 20)
    table_spec().check(1 << 20)


def test_a_joined_machine_counts_as_an_empty_push_until_every_machine_joined():
    server = RoundDriver(machines=3)
    server.declare(KEY, table_spec())
    push(server, 0, 0, [1], [[1, 1]])
    push(server, 1, 0, [1, 4], [[2, 2], [4, 4]])
    assert server.take(Command.PULL_RESPONSE) == []
    server.join(2)  # machine 2 ran out of data: the open round has every other machine's push, and closes
    assert answers(server) == {0: ([1, 4], [[3, 3], [4, 4]]), 1: ([1, 4], [[3, 3], [4, 4]])}
    push(server, 1, 1, [7], [[7, 7]])  # later rounds wait for the machines that have not joined only
    assert server.take(Command.PULL_RESPONSE) == []
    push(server, 0, 1, [], [])
    assert answers(server) == {0: ([7], [[7, 7]]), 1: ([7], [[7, 7]])}
    server.join(0)
    push(server, 1, 2, [2], [[2, 2]])  # the last machine alone
    assert answers(server) == {1: ([2], [[2, 2]])}
    server.join(1)  # every machine joined: round 3 waits for all three again
    for rank in (0, 1):
        push(server, rank, 3, [rank], [[1, 1]])
    assert server.take(Command.PULL_RESPONSE) == []
    push(server, 2, 3, [2], [[1, 1]])
    assert answers(server) == {r: ([0, 1, 2], [[1, 1]] * 3) for r in range(3)}


def test_a_join_that_completes_a_round_too_large_to_answer_fails_it_and_stands():
    server = RoundDriver(machines=2)
    server.services.max_payload_bytes = 8  # a record (8-byte id, 8-byte row) never fits
    server.declare(KEY, table_spec())
    push(server, 0, 0, [1], [[1, 1]])
    server.join(1)  # the answer cannot be sent: the round fails on machine 0, the JOIN is kept
    assert [s.to for s in server.take(Command.ERROR)] == [0] and 1 in server.services.joined


def test_with_several_workers_per_machine_each_machine_pushes_once_and_a_joined_machine_is_an_empty_push():
    # The table's local root pushes its machine's rows (summed there: byteps.common.engine.sparse_local): the
    # round closes with one push per machine, whichever local rank is the root.
    server = RoundDriver(machines=2, local_size=2)
    policy = server.declare(KEY, table_spec())
    push(server, 1, 0, [0, 1], [[1, 1], [2, 2]])  # machine 0's root is local rank 1
    assert server.take(Command.PULL_RESPONSE) == []
    assert policy.partial_round().pushed_ranks == {0}  # machine 0 pushed, machine 1 not yet
    with pytest.raises(ValueError, match="second push of round 0"):
        push(server, 0, 0, [3], [[1, 1]])  # machine 0's other rank: its machine pushed already
    push(server, 2, 0, [1, 2], [[1, 1], [1, 1]])
    assert answers(server) == {r: ([0, 1, 2], [[1, 1], [3, 3], [1, 1]]) for r in (1, 2)}
    server.join(3)  # machine 1 (ranks 2 and 3) joined: round 1 waits for machine 0 only
    push(server, 1, 1, [5], [[5, 5]])
    assert answers(server) == {1: ([5], [[5, 5]])}
