"""Elastic data-parallel training of the digits CNN: workers may be lost or added while it trains.

The same model and data as ``train_digits.py``, written as a Horovod
elastic script (``hvd.elastic.run``, ``TorchState``, ``ElasticSampler``)
with only the import changed. Run it with a range of workers::

    bpslaunch -np 3 --min-np 2 --max-np 3 -- python examples/torch/train_digits_elastic.py

Kill one worker (``kill -9``) and the other two roll back to their last
commit and go on; give bpslaunch a ``--host-discovery-script`` that
reports more slots and new workers join at the next commit, getting the
current weights from rank 0. The learning rate follows the number of
workers (Horovod's rule), reset after every change of membership; in
asynchronous training (``BYTEPS_ENABLE_ASYNC=1``), where every worker's own
step lands on the servers' parameters, it stays each worker's own and
every delta counts once (docs/elastic.md, "Asynchronous training").

Every rank prints one ``joined:`` line each time it (re)enters training;
rank 0 prints one line per epoch and the held-out accuracy. ``--log-steps``
adds a ``step S epoch E samples P`` line per rank after every commit.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import byteps.torch as bps

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import DigitsNet, evaluate, load_data  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05,
                        help="per worker; times the number of workers when they average gradients (not in "
                             "asynchronous training, BYTEPS_ENABLE_ASYNC=1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-accuracy", type=float, default=0.9)
    parser.add_argument("--log-steps", action="store_true", help="one line per rank after every commit")
    args = parser.parse_args()

    bps.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train_set, test_set = load_data(args.seed)
    model = DigitsNet()
    asynchronous = os.environ.get("BYTEPS_ENABLE_ASYNC", "0") == "1"

    def rate() -> float:  # averaged gradients take n workers' data per step; an asynchronous step, one worker's
        return args.lr if asynchronous else args.lr * bps.size()

    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=rate(), momentum=0.9),
                                         named_parameters=model.named_parameters())
    sampler = bps.elastic.ElasticSampler(train_set, shuffle=True, seed=args.seed)
    state = bps.elastic.TorchState(model, optimizer, sampler=sampler, epoch=1, batch=0, steps=0)

    def follow_membership() -> None:  # after every change: the rate of the new number of workers
        for group in optimizer.param_groups:
            group["lr"] = rate()

    state.register_reset_callbacks([follow_membership])

    @bps.elastic.run
    def train(state: bps.elastic.TorchState) -> None:
        checksum = sum(p.double().sum().item() for p in model.parameters())
        print(f"joined: rank {bps.rank()} of {bps.size()} at epoch {state.epoch} batch {state.batch}, "
              f"{state.steps} steps so far, weights checksum {checksum:.6f}", flush=True)
        while state.epoch <= args.epochs:
            loader = DataLoader(train_set, batch_size=args.batch_size, sampler=state.sampler)
            loss_sum, seen = 0.0, 0
            for images, labels in loader:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(images), labels)
                loss.backward()
                optimizer.step()
                loss_sum, seen = loss_sum + loss.item() * len(labels), seen + len(labels)
                state.batch += 1
                state.steps += 1
                state.sampler.record_batch(state.batch, args.batch_size)
                state.commit()
                if args.log_steps:
                    print(f"step {state.steps} epoch {state.epoch} samples {state.sampler.processed_num}", flush=True)
            if bps.rank() == 0:
                print(f"epoch {state.epoch:2d}: loss {loss_sum / max(seen, 1):.4f} with {bps.size()} worker(s), "
                      f"{state.steps} steps so far", flush=True)
            state.epoch, state.batch = state.epoch + 1, 0  # committed together: an epoch is never redone
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    accuracy = evaluate(model, test_set, torch.device("cpu"))
    if bps.rank() == 0:
        print(f"held-out accuracy {accuracy:.3f} on {len(test_set)} images after {state.steps} steps", flush=True)
    if accuracy < args.min_accuracy:
        print(f"accuracy {accuracy:.3f} is below --min-accuracy {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
