"""Worker script: hvd.join() for uneven data, checked by every rank against a reference.

Rank r has ``3 + 2 * r`` batches, so ranks run out of data at different
steps. Checks: an allreduce loop where a joined rank counts as zeros (the
average still divides by size()); the same with DistributedOptimizer,
whose weights, broadcast from the rank join() returns, equal a numpy
reference; what
Horovod refuses while a rank has joined (allgather, broadcast); and that
after join() ranks agree again on what the others declared meanwhile (a
tensor first used while a rank had joined, unnamed ops). Prints ``OK
<check>`` per check and ``ALL OK <n>``; the first failure exits 1.

With ``--backup`` (BYTEPS_BACKUP_WORKERS set): rounds close without the
late machines, so rank r pushes 2^r and the average says which ranks a
round holds: the running ranks of exactly min(quorum, machines still
running) machines, the same sequence on every rank; then the agreement
after join. ``join()`` returns the rank that joined last in causal order
(one a joined rank's zeros reached), the same on every rank.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
from check_runner import Checks, assert_equal, expect_error

import byteps.torch as bps

checks = Checks()
BIG = 32768  # float32 elements


def batches(rank):
    return 3 + 2 * rank


def uneven_allreduce():
    r, n = bps.rank(), bps.size()
    for step in range(batches(r)):
        x = torch.full((5, 3), float((r + 1) * (step + 1)))
        y = bps.allreduce(x, name="uneven.grad")              # average over all n, joined ranks as zeros
        z = bps.allreduce(torch.tensor([step + 1, r + 1], dtype=torch.int64), op=bps.Sum, name="uneven.count")
        # 128 KiB: co-located servers get it through shared memory (BYTEPS_ENABLE_IPC=1, the default)
        big = bps.allreduce(torch.arange(BIG, dtype=torch.float32) * (r + 1), op=bps.Sum, name="uneven.big")
        active = [k for k in range(n) if batches(k) > step]
        assert_equal(big, torch.arange(BIG, dtype=torch.float32) * sum(k + 1 for k in active), f"large sum at {step}")
        assert_equal(y, torch.full((5, 3), sum((k + 1) * (step + 1) for k in active) / n), f"average at {step}")
        assert_equal(z, torch.tensor([(step + 1) * len(active), sum(k + 1 for k in active)]), f"sum at {step}")
    last = bps.join()
    assert last == n - 1, f"join() returned {last}; rank {n - 1} has the most batches"
    assert bps.allgather_object(last) == [last] * n


def uneven_training():
    """Linear regression with rank-dependent batch counts; every rank ends with the reference weights."""
    r, n = bps.rank(), bps.size()
    rng = np.random.default_rng(7)
    data = [[(rng.normal(size=(4, 3)), rng.normal(size=(4, 1))) for _ in range(batches(k))] for k in range(n)]
    model = torch.nn.Linear(3, 1, bias=False).double()
    torch.nn.init.constant_(model.weight, 0.5)
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    for x, y in data[r]:
        optimizer.zero_grad()
        loss = ((model(torch.from_numpy(x)) - torch.from_numpy(y)) ** 2).mean()
        loss.backward()
        optimizer.step()
    # As in Horovod, a rank that joined stops updating its weights; the last to join has the final ones.
    last = bps.join()
    bps.broadcast_parameters(model.state_dict(), root_rank=last)
    weight = np.full((1, 3), 0.5)
    for step in range(max(batches(k) for k in range(n))):
        batch = [data[k][step] for k in range(n) if step < len(data[k])]
        grads = [2 * x.T @ (x @ weight.T - y) / len(x) for x, y in batch]
        weight = weight - 0.1 * (sum(grads).T / n)   # joined ranks contribute zero gradients
    assert_equal(model.weight.detach(), torch.from_numpy(weight), "weights after uneven training",
                 rtol=1e-9, atol=1e-12)


def refused_while_joined():
    """Horovod's rule: with a rank joined, allgather and broadcast fail on the ranks still running.

    With two processes per machine a machine's sum of a tensor is rooted on one of its ranks by tensor id, so
    some of these collectives are rooted on the joined rank 0: its refusal must reach its peer and, through the
    servers, the other machines (which wait for that machine's push otherwise)."""
    r, n = bps.rank(), bps.size()
    if r == 0:
        bps.join()
    else:
        def refusals(tag):
            return [expect_error(RuntimeError, "joined", lambda: bps.allgather(torch.ones(2, 3),
                                                                               name=f"joined.gather.{tag}")),
                    expect_error(RuntimeError, "joined", lambda: bps.broadcast(torch.ones(4), root_rank=r,
                                                                               name=f"joined.bc.{tag}"))]

        messages = refusals("a") + refusals("b")
        y = bps.allreduce(torch.full((4,), 2.0), op=bps.Sum, name="joined.sum")   # still fine
        assert_equal(y, torch.full((4,), 2.0 * (n - 1)), "sum with rank 0 joined")
        messages += refusals("c")  # one more tensor id since "a": its sums are rooted on the other local rank
        if bps.local_size() == 2 and r == 1:  # rank 0's peer: some refusals came from it, some were its own
            from_joined_root = [m for m in messages if "local rank 0: " in m]
            assert 0 < len(from_joined_root) < len(messages), messages
        bps.join()


def agreement_after_join():
    """Tensors first used while a rank had joined, and unnamed ops, line up again after join()."""
    r, n = bps.rank(), bps.size()
    if r != 0:
        for _ in range(3):
            bps.allreduce(torch.ones(7), name="declared.while.joined")
            bps.allreduce(torch.ones(2))                     # unnamed: the default-name counter moves on
    bps.join()
    y = bps.allreduce(torch.full((7,), float(r)), op=bps.Sum, name="declared.while.joined")
    assert_equal(y, torch.full((7,), float(sum(range(n)))), "a tensor declared while rank 0 had joined")
    y = bps.allreduce(torch.full((3,), float(r + 1)), op=bps.Sum)
    assert_equal(y, torch.full((3,), float(sum(range(1, n + 1)))), "an unnamed allreduce after join")
    y = bps.allreduce(torch.full((2,), float(r)), op=bps.Sum, name="first.after.join")
    assert_equal(y, torch.full((2,), float(sum(range(n)))), "a new tensor after join")
    gathered = bps.allgather(torch.full((r + 1, 2), float(r)), name="gather.after.join")
    assert gathered.shape == (n * (n + 1) // 2, 2), gathered.shape


def backup_allreduce():
    """Backup workers and join together: which machines each closed round holds, the same on every rank."""
    r, n, local = bps.rank(), bps.size(), bps.local_size()
    machines = n // local
    quorum = machines - int(os.environ["BYTEPS_BACKUP_WORKERS"])
    steps = max(batches(k) for k in range(n))
    seen = torch.zeros(steps, dtype=torch.float64)
    for step in range(batches(r)):
        y = bps.allreduce(torch.full((4,), float(1 << r), dtype=torch.float64), name="backup.grad")
        held = int(round(float(y[0]) * quorum * local))  # the ranks whose pushes the round holds, as bits
        running = [k for k in range(n) if batches(k) > step]
        live = {k // local for k in running}
        members = {k // local for k in range(n) if held >> k & 1}
        assert members <= live and len(members) == min(quorum, len(live)), (step, held, live)
        assert {k for k in range(n) if held >> k & 1} == {k for k in running if k // local in members}, (step, held)
        seen[step] = held
    # Machines do not wait for each other here, so any machine's last rank may join last; inside a machine
    # the rank with the most batches trains on with its peers as zeros, so it joins after them.
    last = bps.join()
    assert last % local == local - 1, f"join() returned {last}, not the rank with its machine's most batches"
    assert bps.allgather_object(last) == [last] * n
    histories = bps.allgather(seen.unsqueeze(0), name="backup.seen")
    for k in range(n):
        count = batches(k)
        assert_equal(histories[k, :count], histories[n - 1, :count], f"rank {k}'s closed rounds")


def main():
    bps.init()
    if "--backup" in sys.argv:
        checks.run("backup workers with uneven data", backup_allreduce)
        checks.run("agreement after join", agreement_after_join)
        bps.shutdown()
        checks.done()
        return
    checks.run("uneven allreduce loop", uneven_allreduce)
    checks.run("uneven DistributedOptimizer training", uneven_training)
    checks.run("allgather and broadcast refused while a rank joined", refused_while_joined)
    checks.run("agreement after join", agreement_after_join)
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
