"""Worker of the SyncBatchNorm tests: each rank normalizes its slice of one batch; checked against one process.

Usage: python sync_batch_norm_checks.py [DEVICE]   (cpu by default; cuda: on the GPU, local rank modulo GPUs)
Every rank builds the whole batch from a seed, takes its own rows (ranks
get different numbers of rows), and compares SyncBatchNorm's output, input
gradient and running statistics with torch.nn.BatchNorm on the whole
batch; the weight's and bias's gradients summed over the ranks must equal
the whole batch's. Prints ``SYNCBN OK``.
"""

from __future__ import annotations

import sys

import torch

import byteps.torch as bps


def check(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    got, want = got.cpu(), want.cpu()
    if not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
        raise AssertionError(f"{what}: largest difference {(got - want).abs().max().item():.3g}")


def main() -> None:
    bps.init()
    rank, size = bps.rank(), bps.size()
    device = torch.device("cpu")
    if sys.argv[1:] == ["cuda"]:
        device = torch.device("cuda", bps.local_rank() % torch.cuda.device_count())
    for shape, momentum in [((11, 3), 0.1), ((9, 4, 5, 5), None), ((7, 2, 3, 4, 2), 0.3)]:
        torch.manual_seed(0)
        counts = [shape[0] // size + r for r in range(size)]  # rank r gets counts[r] rows: uneven
        rows = (torch.randn(sum(counts), *shape[1:]) * 3 + 1).to(device)
        upstream = torch.randn(sum(counts), *shape[1:]).to(device)
        start = sum(counts[:rank])
        mine = slice(start, start + counts[rank])
        channels = shape[1]
        reference = torch.nn.BatchNorm1d(channels, momentum=momentum) if len(shape) <= 3 else \
            torch.nn.BatchNorm2d(channels, momentum=momentum) if len(shape) == 4 else \
            torch.nn.BatchNorm3d(channels, momentum=momentum)
        synced = bps.SyncBatchNorm(channels, momentum=momentum)
        reference, synced = reference.to(device), synced.to(device)
        with torch.no_grad():
            for layer in (reference, synced):
                layer.weight.copy_(torch.linspace(0.5, 1.5, channels))
                layer.bias.copy_(torch.linspace(-1, 1, channels))
        x_all = rows.clone().requires_grad_(True)
        x_mine = rows[mine].clone().requires_grad_(True)
        for _ in range(2):  # twice, so the running statistics are updated from non-initial values
            reference.zero_grad()
            synced.zero_grad()
            x_all.grad = x_mine.grad = None
            want = reference(x_all)
            (want * upstream).sum().backward()
            got = synced(x_mine)
            (got * upstream[mine]).sum().backward()
            check(f"{shape} output", got, want[mine])
            check(f"{shape} input gradient", x_mine.grad, x_all.grad[mine])
            weight_sum = bps.allreduce(synced.weight.grad, op=bps.Sum, name="weight_grad")
            bias_sum = bps.allreduce(synced.bias.grad, op=bps.Sum, name="bias_grad")
            check(f"{shape} weight gradient (sum over ranks)", weight_sum, reference.weight.grad)
            check(f"{shape} bias gradient (sum over ranks)", bias_sum, reference.bias.grad)
        check(f"{shape} running mean", synced.running_mean, reference.running_mean)
        check(f"{shape} running var", synced.running_var, reference.running_var)
        synced.eval()
        reference.eval()
        check(f"{shape} evaluation", synced(x_mine.detach()), reference(x_all.detach())[mine])
    print(f"SYNCBN OK rank {rank} of {size} on {device}", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
