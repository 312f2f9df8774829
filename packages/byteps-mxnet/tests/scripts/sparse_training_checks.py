"""Worker script: DistributedTrainer with an ``Embedding(sparse_grad=True)`` (row_sparse gradients).

Run under bpslaunch with 2 or more ranks. ``row-sparse``: the embedding's gradient goes through the row-sparse
push_pull and its table holds one round a step; ``dense`` (BYTEPS_ROW_SPARSE=0):
it goes as a dense array and comes back row_sparse. Either way every rank's weights after the steps must equal a
single-process run that averages every rank's gradients itself (numpy float64 SGD, from the same weights),
and the rows no rank touched must be untouched.
"""

from __future__ import annotations

import sys

import mxnet as mx
import numpy as np
from check_runner import Checks, expect_error
from mxnet import autograd, gluon

import byteps.mxnet as bps
from byteps.common import api

ROWS, DIM, STEPS, BATCH, LR = 1000, 8, 6, 16, 0.5
checks = Checks()


def make_net(prefix: str):
    net = gluon.nn.HybridSequential(prefix=prefix)
    with net.name_scope():
        net.add(gluon.nn.Embedding(ROWS, DIM, sparse_grad=True), gluon.nn.Flatten(),
                gluon.nn.Dense(1, in_units=DIM * 3))
    mx.random.seed(7)
    net.initialize(mx.init.Uniform(0.1))
    return net


def batch(step: int, rank: int):
    """Rank ``rank``'s ids (3 per sample, some shared between ranks, duplicates within a batch) and targets."""
    rng = np.random.RandomState(100 * step + rank)
    ids = rng.randint(0, 40, (BATCH, 3)) + (0 if rng.rand() < 0.5 else 500)  # the table's two ends
    return mx.nd.array(ids.astype(np.float32)), mx.nd.array(rng.uniform(-1, 1, (BATCH, 1)).astype(np.float32))


def gradients(net, ids, targets):
    with autograd.record():
        loss = ((net(ids) - targets) ** 2).mean()
    loss.backward()
    return {name: p.grad().tostype("default").asnumpy().astype(np.float64) for name, p in net.collect_params().items()}


def reference() -> dict:
    """Every rank's gradients from the same weights, averaged, applied by plain SGD; step by step."""
    net = make_net("reference_")
    params = net.collect_params()
    for step in range(STEPS):
        grads = [gradients(net, *batch(step, rank)) for rank in range(bps.size())]
        for name, p in params.items():
            mean = sum(g[name] for g in grads) / len(grads)
            p.set_data(mx.nd.array((p.data().asnumpy().astype(np.float64) - LR * mean).astype(np.float32)))
    return {name[len("reference_"):]: p.data().asnumpy() for name, p in params.items()}


def trainer_matches_the_single_process_reference():
    net = make_net("sparse_")
    embedding = net[0].weight
    assert embedding.grad().stype == "row_sparse"
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": LR, "wd": 0.0})
    untouched = embedding.data().asnumpy()[100:500].copy()  # no batch draws ids 40..499
    for step in range(STEPS):
        ids, targets = batch(step, bps.rank())
        with autograd.record():
            loss = ((net(ids) - targets) ** 2).mean()
        loss.backward()
        trainer.step(1)  # the loss is a mean already
    expected = reference()
    for name, p in net.collect_params().items():
        np.testing.assert_allclose(p.data().asnumpy(), expected[name[len("sparse_"):]], rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    np.testing.assert_array_equal(embedding.data().asnumpy()[100:500], untouched)
    assert embedding.grad().stype == "row_sparse"
    table = next((t for name, t in api.worker().sparse.tables.items() if "Gradient.sparse_embedding0_weight" in name),
                 None)
    if MODE == "row-sparse":
        assert table is not None and table.rounds == STEPS, list(api.worker().sparse.tables)
    else:
        assert table is None, list(api.worker().sparse.tables)


def float16_rows_average_as_numpy():
    """A float16 ``row_sparse`` gradient through the adapter's row-sparse path (``row_sparse.start``, what
    DistributedTrainer calls): every rank's rows averaged by id, within float16's precision, back as float16
    row_sparse over the union of ids."""
    if MODE != "row-sparse":
        return
    from byteps.mxnet import row_sparse

    def rows_of(rank: int):
        rng = np.random.RandomState(7 + rank)
        ids = np.unique(rng.randint(0, 50, 12))
        return ids, rng.uniform(-1, 1, (len(ids), DIM)).astype(np.float16)

    ids, rows = rows_of(bps.rank())
    grad = mx.nd.sparse.row_sparse_array((rows, ids), shape=(50, DIM), dtype=np.float16)
    result = row_sparse.start(grad, "float16.check", average=True).finish()
    assert result.stype == "row_sparse" and result.dtype == np.float16, (result.stype, result.dtype)
    want = np.zeros((50, DIM))
    for rank in range(bps.size()):
        their_ids, their_rows = rows_of(rank)
        want[their_ids] += their_rows.astype(np.float64)
    union = np.unique(np.concatenate([rows_of(rank)[0] for rank in range(bps.size())]))
    np.testing.assert_array_equal(result.indices.asnumpy(), union)
    np.testing.assert_allclose(result.tostype("default").asnumpy().astype(np.float64), want / bps.size(),
                               rtol=1e-2, atol=2e-3)


def stored_row_sparse_weights_are_refused():
    weight = gluon.Parameter("refused_weight", shape=(10, 4), stype="row_sparse", grad_stype="row_sparse")
    weight.initialize()
    expect_error(ValueError, "stored row_sparse",
                 lambda: bps.DistributedTrainer([weight], "sgd", {"learning_rate": 0.1}))


if __name__ == "__main__":
    MODE = sys.argv[1]
    bps.init()
    checks.run("trainer_matches_the_single_process_reference", trainer_matches_the_single_process_reference)
    checks.run("float16_rows_average_as_numpy", float16_rows_average_as_numpy)
    checks.run("stored_row_sparse_weights_are_refused", stored_row_sparse_weights_are_refused)
    checks.done()
    bps.shutdown()
