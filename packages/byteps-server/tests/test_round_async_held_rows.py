"""AsyncHeldRows, an asynchronous server-held table's rows on one server, driven directly (round_driver.py)."""

import numpy as np
import pytest
from round_driver import RoundDriver

from byteps.common.dtypes import DType
from byteps.common.held_table import HeldTable, initial_rows
from byteps.common.row_sparse import encode, sparse_key
from byteps.common.tensor_description import PartitionSpec
from byteps.server.rounds import AsyncHeldRows
from byteps.transport import Command
from byteps.transport.frames import FLAG_AVERAGE, FLAG_PULL

KEY = sparse_key(1 << 31, 0)
HELD = HeldTable("sgd", lr=0.5, seed=3, init_std=0.1)


def held_spec(num_rows: int = 10) -> PartitionSpec:
    return PartitionSpec(name="emb", partition=0, shape=(num_rows, 2), tensor_nbytes=num_rows * 8, nbytes=8,
                         dtype=int(DType.FLOAT32), sparse=True, held=HELD.wire(), asynchronous=True)


def push(server: RoundDriver, rank: int, round_: int, ids, values, flags: int = FLAG_PULL, aux: int = 0):
    payload = encode(np.asarray(ids, np.int64), np.asarray(values, np.float32).reshape(len(ids), 2)).tobytes()
    server.push(KEY, rank, round_, payload=payload, flags=flags, aux=aux)
    if flags & FLAG_PULL:
        server.pull(KEY, rank, round_)


def start(ids) -> np.ndarray:
    return initial_rows(HELD, np.asarray(ids, np.int64), 2)


def test_each_push_is_applied_on_arrival_once_and_answered_alone():
    server = RoundDriver(machines=2, local_size=2)  # 4 processes, each pushing its own rows
    policy = server.declare(KEY, held_spec())
    assert isinstance(policy, AsyncHeldRows)
    push(server, 3, 0, [1, 4], [[1, 1], [2, 2]])
    assert [s.to for s in server.take(Command.PULL_RESPONSE)] == [3]  # nobody else waited for
    np.testing.assert_allclose(policy.store.lookup(np.array([1, 4])), start([1, 4]) - 0.5 * np.array([[1, 1], [2, 2]]))
    push(server, 3, 1, [1], [[1, 1]], flags=FLAG_PULL | FLAG_AVERAGE)  # not averaged: each worker's own step
    push(server, 0, 0, [1], [[2, 2]])
    np.testing.assert_allclose(policy.store.lookup(np.array([1])), start([1]) - 0.5 * 4)
    assert server.services.async_pushes == 3
    with pytest.raises(ValueError, match="applied once, in order"):
        push(server, 3, 1, [1], [[1, 1]])  # a duplicate
    push(server, 3, 5, [], [])  # a gap: calls refused on that process
    np.testing.assert_allclose(policy.store.lookup(np.array([1])), start([1]) - 0.5 * 4)


def test_a_push_in_parts_is_applied_when_whole():
    server = RoundDriver(machines=2)
    policy = server.declare(KEY, held_spec())
    push(server, 0, 0, [1], [[1, 1]], flags=0, aux=2)
    np.testing.assert_allclose(policy.store.lookup(np.array([1])), start([1]))
    assert policy.partial_round().pushed_ranks == {0}
    push(server, 0, 0, [3], [[1, 1]], aux=2)
    np.testing.assert_allclose(policy.store.lookup(np.array([1, 3])), start([1, 3]) - 0.5)
    assert policy.partial_round() is None
    push(server, 1, 0, [5], [[1, 1]], flags=0, aux=2)
    with pytest.raises(ValueError, match="not unique and ascending"):
        push(server, 1, 0, [2], [[1, 1]], aux=2)


def test_the_staleness_bound_holds_a_fast_process_s_answer():
    server = RoundDriver(machines=2, staleness=1)
    server.declare(KEY, held_spec())
    push(server, 0, 0, [1], [[1, 1]])
    assert [s.to for s in server.take(Command.PULL_RESPONSE)] == [0]  # one ahead of worker 1: within the bound
    push(server, 0, 1, [1], [[1, 1]])
    assert server.take(Command.PULL_RESPONSE) == []  # two ahead: held
    push(server, 1, 0, [2], [[1, 1]])
    assert sorted(s.to for s in server.take(Command.PULL_RESPONSE)) == [0, 1]
    push(server, 0, 2, [1], [[1, 1]])
    assert server.take(Command.PULL_RESPONSE) == []
    server.join(1)  # a joined machine holds nobody back
    assert [s.to for s in server.take(Command.PULL_RESPONSE)] == [0]
