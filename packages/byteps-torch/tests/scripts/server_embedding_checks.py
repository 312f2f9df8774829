"""Worker script of test_server_embedding.py: a ServerEmbedding trained beside a dense layer, on every rank
against a single-process reference that trains torch's own nn.Embedding and optimizers on every rank's batches.

The reference's table starts from the same rows (``initial_rows`` of every id), its gradients are averaged
over the ranks as the servers do, and it steps with torch.optim.SGD or Adagrad (whose dense step leaves
rows without a gradient alone, as the servers' per-row step does). Checks, each printing ``OK <name>``:
``sgd``, ``adagrad`` (training, then every rank's lookup of the final rows and the dense layer against the
reference), ``eval_on_one_rank`` (rank 0 alone looks rows up in eval mode; nothing waits for the others),
``save_and_load`` (into the directory given as the first argument), ``bad_ids``.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from check_runner import Checks, assert_close, expect_error

import byteps.torch as bps
from byteps.common.held_table import HeldTable, initial_rows

ROWS, DIM, FIELDS, BATCH, STEPS = 3000, 8, 5, 16, 6
checks = Checks()


def batch(rank: int, step: int):
    rng = np.random.default_rng(1000 * rank + step)
    ids = (rng.zipf(1.5, size=(BATCH, FIELDS)) - 1) % ROWS  # power-law ids: many repeats within a batch
    return torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(rng.normal(size=BATCH).astype(np.float32))


def model_loss(embed, dense, ids, y):
    return ((dense(embed(ids).sum(1)).squeeze(1) - y) ** 2).mean()


def train(optimizer: str, kwargs: dict) -> None:
    r, n = bps.rank(), bps.size()
    name = f"emb.{optimizer}"
    emb = bps.ServerEmbedding(ROWS, DIM, name=name, optimizer=optimizer, seed=7, init_std=0.1, **kwargs)
    torch.manual_seed(0)
    dense = torch.nn.Linear(DIM, 1)
    opt = bps.DistributedOptimizer(torch.optim.SGD(dense.parameters(), lr=0.05),
                                   named_parameters=[(f"{name}.{k}", v) for k, v in dense.named_parameters()])
    held = HeldTable(optimizer=optimizer, seed=7, init_std=0.1, **kwargs)
    ref_table = torch.nn.Embedding(ROWS, DIM)
    ref_table.weight.data = torch.from_numpy(initial_rows(held, np.arange(ROWS), DIM))
    torch.manual_seed(0)
    ref_dense = torch.nn.Linear(DIM, 1)
    ref_opts = [torch.optim.SGD(ref_dense.parameters(), lr=0.05),
                torch.optim.SGD([ref_table.weight], lr=kwargs["lr"]) if optimizer == "sgd" else
                torch.optim.Adagrad([ref_table.weight], lr=kwargs["lr"], eps=held.eps,
                                    initial_accumulator_value=kwargs["initial_accumulator"])]
    for step in range(STEPS):
        ids, y = batch(r, step)
        if step == 2:  # a forward in training mode that no backward reaches (a loss only printed): no round
            model_loss(emb, dense, ids, y).item()
        opt.zero_grad()
        model_loss(emb, dense, ids, y).backward()
        opt.step()
        for ref_opt in ref_opts:
            ref_opt.zero_grad()
        for rank in range(n):
            model_loss(ref_table, ref_dense, *batch(rank, step)).backward()
        for param in [ref_table.weight, *ref_dense.parameters()]:
            param.grad /= n
        for ref_opt in ref_opts:
            ref_opt.step()
    touched = torch.unique(torch.cat([batch(rank, step)[0].reshape(-1) for rank in range(n)
                                      for step in range(STEPS)]))
    assert_close(emb.lookup(touched), ref_table.weight.data[touched], f"{optimizer}: the table's rows",
                 rtol=1e-4, atol=1e-5)
    seen = set(touched.tolist())
    untouched = torch.tensor([i for i in range(ROWS - 100, ROWS) if i not in seen][:5], dtype=torch.int64)
    assert len(untouched) == 5, "the batches touched nearly every row"
    assert_close(emb.lookup(untouched), ref_table.weight.data[untouched], f"{optimizer}: rows never trained")
    for got, want in zip(dense.parameters(), ref_dense.parameters()):
        assert_close(got.data, want.data, f"{optimizer}: the dense layer", rtol=1e-4, atol=1e-5)


def eval_on_one_rank() -> None:
    emb = bps.ServerEmbedding(ROWS, DIM, name="emb.sgd", optimizer="sgd", lr=0.2, seed=7, init_std=0.1)
    if bps.rank() == 0:
        emb.eval()
        with torch.no_grad():
            out = emb(torch.tensor([[1, 2], [2, 1]]))
        assert out.shape == (2, 2, DIM) and torch.equal(out[0, 0], out[1, 1])
    bps.barrier()


def save_and_load(directory: str) -> None:
    """The table saved, changed by a step, loaded: the saved rows again (on every rank)."""
    emb = bps.ServerEmbedding(ROWS, DIM, name="emb.sgd", optimizer="sgd", lr=0.2, seed=7, init_std=0.1)
    ids = torch.arange(10)
    saved = emb.lookup(ids)
    emb.save(directory)
    emb(ids).sum().backward()
    emb.flush()
    assert not torch.equal(emb.lookup(ids), saved), "the step changed nothing"
    emb.load(directory)
    assert_close(emb.lookup(ids), saved, "the rows loaded")


def bad_ids() -> None:
    emb = bps.ServerEmbedding(ROWS, DIM, name="emb.sgd", optimizer="sgd", lr=0.2, seed=7, init_std=0.1)
    expect_error(ValueError, f"[0, {ROWS})", lambda: emb(torch.tensor([0, ROWS])))
    expect_error(ValueError, "int64 or int32", lambda: emb(torch.tensor([0.0, 1.0])))
    expect_error(ValueError, "first used with sgd", lambda: bps.ServerEmbedding(
        ROWS, DIM, name="emb.sgd", optimizer="adam", lr=0.2).lookup(torch.tensor([1])))


def main() -> None:
    bps.init()
    torch.set_num_threads(1)
    checks.run("sgd", lambda: train("sgd", {"lr": 0.2}))
    checks.run("adagrad", lambda: train("adagrad", {"lr": 0.1, "initial_accumulator": 0.1}))
    checks.run("eval_on_one_rank", eval_on_one_rank)
    checks.run("save_and_load", lambda: save_and_load(sys.argv[1]))
    checks.run("bad_ids", bad_ids)
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
