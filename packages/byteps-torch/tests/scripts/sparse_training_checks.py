"""Sparse gradients (nn.Embedding / nn.EmbeddingBag with sparse=True) through DistributedOptimizer and
sparse_allreduce_async, checked on every rank against a single-process reference.

Usage: python sparse_training_checks.py row-sparse|gather [fused]: the path the layout must take
(docs/sparse.md); ``fused``: the table is small enough to be fused with the dense layer's gradients, so its
first step goes dense and the next ones row-sparse.

Every rank trains on its own batches of ids (duplicates included) and
regenerates every rank's batches from their seeds, so it computes the
averaged gradient of the whole job itself, steps a copy of the model with
the plain torch optimizer on it, and compares the parameters after every
step. It also checks which path was taken: with ``row-sparse`` the
gradient's table exists in the worker's row-sparse tables with one round a
step and the bytes sent per step stay far below the dense table; with
``gather`` no table was made. With ``row-sparse`` a rank also joins early
(hvd.join) while the other trains on. Prints ``OK <check>`` per check, ``ALL OK <n>``.
"""

from __future__ import annotations

import copy
import sys

import numpy as np
import torch
from check_runner import Checks, assert_close, assert_equal

import byteps.torch as bps
from byteps.common import api

ROWS, DIM, STEPS = 1000, 8, 5
checks = Checks()
PATH = sys.argv[1]
FUSED = sys.argv[2:] == ["fused"]


class Net(torch.nn.Module):
    """A sparse embedding (or bag of embeddings) and a dense layer on top."""

    def __init__(self, bag: bool) -> None:
        super().__init__()
        self.bag = bag
        self.embedding = (torch.nn.EmbeddingBag(ROWS, DIM, mode="sum", sparse=True) if bag
                          else torch.nn.Embedding(ROWS, DIM, sparse=True))
        self.dense = torch.nn.Linear(DIM, 1)

    def forward(self, ids: torch.Tensor, use_embedding: bool = True) -> torch.Tensor:
        if not use_embedding:  # a branch a rank may leave out: its embedding gets no gradient
            return self.dense(torch.ones(len(ids), DIM)).squeeze(1)
        if self.bag:  # bags of 3 ids
            return self.dense(self.embedding(ids, torch.arange(0, len(ids), 3))).squeeze(1)
        return self.dense(self.embedding(ids)).squeeze(1)


def batch(rank: int, step: int):
    """Rank ``rank``'s ids and targets of ``step``: 12 ids of the first 60 rows (duplicates within a rank and
    overlaps between ranks are certain), and one far row of the rank's own."""
    generator = torch.Generator().manual_seed(7919 * rank + step)
    ids = torch.cat([torch.randint(0, 60, (11,), generator=generator), torch.tensor([900 + rank])])
    return ids, torch.randn(12, generator=generator)


def uses_embedding(rank: int, step: int, tag: str) -> bool:
    """Rank 1 leaves the embedding out at step 2 of the check ``unused``."""
    return not (tag == "unused" and rank == 1 and step == 2)


def loss_of(model: Net, rank: int, step: int, tag: str) -> torch.Tensor:
    ids, target = batch(rank, step)
    output = model(ids, uses_embedding(rank, step, tag))
    return ((output - target[:len(output)]) ** 2).mean()


def averaged_gradients(model: Net, step: int, tag: str, ranks=None) -> dict:
    """Every rank's gradients of ``step`` averaged, as the job's averaged gradient (sparse ones stay sparse);
    ``ranks``: those that trained the step (the others joined: zeros in the average)."""
    total: dict = {}
    for rank in range(bps.size()) if ranks is None else ranks:
        model.zero_grad()
        loss_of(model, rank, step, tag).backward()
        for name, p in model.named_parameters():
            if p.grad is not None:
                total[name] = p.grad.clone() if name not in total else total[name] + p.grad
    return {name: (grad / bps.size()).coalesce() if grad.is_sparse else grad / bps.size()
            for name, grad in total.items()}


def train(tag: str, bag: bool, make_optimizer, sparse_as_dense: bool = False) -> None:
    torch.manual_seed(3)
    model = Net(bag)
    reference = copy.deepcopy(model)
    reference_optimizer = make_optimizer(reference)
    optimizer = bps.DistributedOptimizer(make_optimizer(model),
                                         named_parameters=[(f"{tag}.{n}", p) for n, p in model.named_parameters()],
                                         sparse_as_dense=sparse_as_dense)
    worker = api.worker()
    sent = worker.bytes_sent
    for step in range(STEPS):
        if step == 1:
            sent = worker.bytes_sent  # a fused table's first step went dense
        optimizer.zero_grad()
        loss_of(model, bps.rank(), step, tag).backward()
        optimizer.step()
        gradient = model.embedding.weight.grad
        assert gradient.is_sparse, f"step {step}: the embedding's gradient came back dense"
        for name, grad in averaged_gradients(reference, step, tag).items():
            dict(reference.named_parameters())[name].grad = grad
        reference_optimizer.step()
        assert_close(gradient.to_dense(), reference.embedding.weight.grad.to_dense(), f"{tag} step {step} gradient")
        for (name, p), (_, want) in zip(model.named_parameters(), reference.named_parameters()):
            assert_close(p.detach(), want.detach(), f"{tag} step {step} {name}")
    table = worker.sparse.tables.get(f"Gradient.{tag}.embedding.weight")
    if PATH == "row-sparse" and not sparse_as_dense:
        assert table is not None and table.rounds == STEPS - FUSED, (tag, table)
        assert gradient.is_coalesced(), "a row-sparse result is coalesced"
        per_step = (worker.bytes_sent - sent) / (STEPS - 1)
        assert per_step < ROWS * DIM * 4 / 8, f"{per_step} bytes sent per step: the dense table went"
    else:
        assert table is None, f"{tag}: {PATH} layout or sparse_as_dense, yet a row-sparse table was used"


def sgd() -> None:
    train("sgd", False, lambda model: torch.optim.SGD(model.parameters(), lr=0.5))


def adagrad_embedding_bag() -> None:
    train("adagrad", True, lambda model: torch.optim.Adagrad(model.parameters(), lr=0.3))


def sgd_embedding_unused_on_one_rank() -> None:
    """Rank 1's embedding gets no gradient at step 2: it pushes no rows, the others' rows are averaged."""
    train("unused", False, lambda model: torch.optim.SGD(model.parameters(), lr=0.5))


def sgd_sparse_as_dense() -> None:
    train("dense", False, lambda model: torch.optim.SGD(model.parameters(), lr=0.5), sparse_as_dense=True)


def ddp_sparse_embedding() -> None:
    """byteps' DistributedDataParallel over a sparse embedding: its gradient comes back sparse, averaged over
    the job (rank 1's embedding unused at step 2 sends no rows), and SGD steps as on the whole batch."""
    from byteps.torch.parallel import DistributedDataParallel

    torch.manual_seed(3)
    model = Net(False)
    reference = copy.deepcopy(model)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(STEPS):
        optimizer.zero_grad()
        ids, target = batch(bps.rank(), step)
        output = ddp(ids, uses_embedding(bps.rank(), step, "unused"))
        ((output - target[:len(output)]) ** 2).mean().backward()
        gradient = model.embedding.weight.grad
        assert gradient is not None and gradient.is_sparse, f"step {step}: {gradient!r}"
        optimizer.step()
        for name, grad in averaged_gradients(reference, step, "unused").items():
            dict(reference.named_parameters())[name].grad = grad
        reference_optimizer.step()
        assert_close(gradient.to_dense(), reference.embedding.weight.grad.to_dense(), f"DDP step {step} gradient")
        for (name, p), (_, want) in zip(model.named_parameters(), reference.named_parameters()):
            assert_close(p.detach(), want.detach(), f"DDP step {step} {name}")
    tables = [t for name, t in api.worker().sparse.tables.items() if name.endswith(".Gradient.embedding.weight")
              and name.startswith("DistributedDataParallel.")]
    if PATH == "row-sparse":
        assert len(tables) == 1 and tables[0].rounds == STEPS, tables
    else:
        assert not tables, tables


def sgd_join_uneven_batches() -> None:
    """Rank 1 runs out of data after 3 steps and joins (hvd.join): rank 0's last 2 steps average its own rows
    with nothing from rank 1, as Horovod counts a joined rank as zeros; then the ranks agree on the tables'
    rounds, take the last-joined rank's parameters, and train a step together. With several processes per
    machine a table's local root counts a joined rank as no rows, and a joined root stands in for the others."""
    torch.manual_seed(3)
    model = Net(False)
    reference = copy.deepcopy(model)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                         named_parameters=[(f"join.{n}", p) for n, p in model.named_parameters()])

    def steps_of(rank: int) -> int:
        return STEPS - 2 * rank

    for step in range(steps_of(bps.rank())):
        optimizer.zero_grad()
        loss_of(model, bps.rank(), step, "join").backward()
        optimizer.step()
    last = bps.join()
    assert last == 0, f"join() returned {last}: rank 0 has the most batches"
    bps.broadcast_parameters(model.state_dict(), root_rank=last)
    optimizer.zero_grad()
    loss_of(model, bps.rank(), STEPS, "join").backward()
    optimizer.step()
    for step in range(STEPS + 1):
        ranks = [r for r in range(bps.size()) if step == STEPS or steps_of(r) > step]
        for name, grad in averaged_gradients(reference, step, "join", ranks).items():
            dict(reference.named_parameters())[name].grad = grad
        reference_optimizer.step()
    for (name, p), (_, want) in zip(model.named_parameters(), reference.named_parameters()):
        assert_close(p.detach(), want.detach(), f"after the join {name}")
    table = api.worker().sparse.tables.get("Gradient.join.embedding.weight")
    assert table is not None and table.rounds == STEPS + 1, table  # rank 1 adopted the rounds it missed


def sparse_adam() -> None:
    """SparseAdam takes sparse gradients only: an embedding alone, the rows it touched updated lazily."""
    torch.manual_seed(5)
    embedding = torch.nn.Embedding(ROWS, DIM, sparse=True)
    reference = copy.deepcopy(embedding)
    weights = torch.linspace(-1, 1, DIM)
    ref_optimizer = torch.optim.SparseAdam(reference.parameters(), lr=0.05)
    optimizer = bps.DistributedOptimizer(torch.optim.SparseAdam(embedding.parameters(), lr=0.05),
                                         named_parameters=[("adam.weight", embedding.weight)])
    for step in range(STEPS):
        optimizer.zero_grad()
        ids, _ = batch(bps.rank(), step)
        (embedding(ids) * weights).sum().backward()
        optimizer.step()
        total = None
        for rank in range(bps.size()):
            reference.zero_grad()
            ids, _ = batch(rank, step)
            (reference(ids) * weights).sum().backward()
            total = reference.weight.grad.clone() if total is None else total + reference.weight.grad
        reference.weight.grad = (total / bps.size()).coalesce()
        ref_optimizer.step()
        assert_close(embedding.weight.detach(), reference.weight.detach(), f"SparseAdam step {step}")


def sparse_allreduce_against_numpy() -> None:
    """sparse_allreduce_async of uncoalesced gradients with duplicate ids (and an empty one), every dtype."""
    me, n = bps.rank(), bps.size()

    def gradient(rank: int, dtype: torch.dtype, case: int) -> torch.Tensor:
        rng = np.random.default_rng(100 * rank + case)
        count = 0 if (case == 1 and rank == 1) else 9
        ids = rng.integers(0, 20, size=count)
        values = rng.uniform(-1, 1, size=(count, 3))
        return torch.sparse_coo_tensor(torch.from_numpy(ids).reshape(1, -1), torch.from_numpy(values).to(dtype),
                                       (100, 3), check_invariants=True)

    for case, dtype in enumerate([torch.float32, torch.float64, torch.float16, torch.bfloat16]):
        for op, op_tag in ((bps.Sum, "sum"), (bps.Average, "average")):
            want = np.zeros((100, 3))
            for rank in range(n):
                grad = gradient(rank, dtype, case).coalesce()
                np.add.at(want, grad.indices()[0].numpy(), grad.values().double().numpy())
            want = want / n if op == bps.Average else want
            got = bps.sparse_allreduce_async(gradient(me, dtype, case), name=f"sa.{case}.{op_tag}", op=op)()
            assert got.is_sparse and got.dtype == dtype and got.shape == (100, 3), (got.dtype, got.shape)
            tolerance = 2e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
            assert_equal(got.to_dense().double(), torch.from_numpy(want), f"{dtype} {op_tag}", rtol=tolerance,
                         atol=tolerance)
            table = f"sa.{case}.{op_tag}[100x3 {str(dtype).replace('torch.', '')}]"
            row_sparse = PATH == "row-sparse"
            assert (table in api.worker().sparse.tables) == row_sparse, (table, list(api.worker().sparse.tables))
            if row_sparse:  # the union of the ranks' rows, coalesced: exactly the rows some rank touched
                touched = sorted({int(i) for rank in range(n)
                                  for i in gradient(rank, dtype, case).coalesce().indices()[0]})
                assert got.is_coalesced() and got.indices()[0].tolist() == touched, got.indices()


def main() -> None:
    assert PATH in ("row-sparse", "gather"), PATH
    bps.init()
    torch.set_num_threads(1)
    checks.run("sgd", sgd)
    checks.run("adagrad_embedding_bag", adagrad_embedding_bag)
    checks.run("sparse_adam", sparse_adam)
    checks.run("embedding_unused_on_one_rank", sgd_embedding_unused_on_one_rank)
    checks.run("sparse_as_dense", sgd_sparse_as_dense)
    checks.run("sparse_allreduce_against_numpy", sparse_allreduce_against_numpy)
    checks.run("ddp_sparse_embedding", ddp_sparse_embedding)
    if PATH == "row-sparse" and not FUSED:  # the gather path is an allgather, which a joined rank refuses
        checks.run("join_uneven_batches", sgd_join_uneven_batches)
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
