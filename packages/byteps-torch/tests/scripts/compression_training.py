"""A few SGD steps of a linear model with DistributedOptimizer(compression_params=...), recorded per rank.

Usage: compression_training.py PARAMS_JSON OUT_DIR STEPS MOMENTUM [hook]

The model is a linear layer times a per-output gain, plus a second linear
layer without bias: the two weights (200 floats each) are compressed, each
alone inside one fused bucket; the bias and the gain (5 floats each) are
too small to compress and go fused in another, getting their Nesterov
momentum after the pull.
With ``hook``: torch's own DistributedDataParallel with byteps_hook and a
HookState on the linear layer alone (the bucket is the weight alone: no
bias, no gain).

Saves OUT_DIR/rank<r>.npz: each step's local gradients (what this rank
computed), the gradients DistributedOptimizer left after synchronize (what
the compressed round gave), and the learning rate each step pushed with
(it decays, so error feedback rescales). test_compression.py replays the
local gradients through byteps.testkit.compression_reference and compares.
"""

import json
import os
import sys
import threading

import numpy as np
import torch

import byteps.torch as bps

params, out_dir, steps, momentum = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
hooked = sys.argv[5:] == ["hook"]
bps.init()
torch.manual_seed(0)


class GainedLinear(torch.nn.Module):
    def __init__(self, full: bool) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(40, 5, bias=full)
        self.gain = torch.nn.Parameter(torch.linspace(0.5, 1.5, 5), requires_grad=full)
        self.linear2 = torch.nn.Linear(40, 5, bias=False) if full else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x) * self.gain
        return out if self.linear2 is None else out + self.linear2(x)


model = GainedLinear(full=not hooked)
NAMES = ("weight", "bias", "gain", "weight2")
trained = [p for p in (model.linear.weight, model.linear.bias, model.gain,
                       None if hooked else model.linear2.weight) if p is not None and p.requires_grad]
optimizer = torch.optim.SGD(trained, lr=0.1, momentum=momentum)
if hooked:
    import torch.distributed as dist

    from byteps.torch.parallel import HookState, byteps_hook

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    dist.init_process_group("gloo", rank=bps.rank(), world_size=bps.size())
    network = torch.nn.parallel.DistributedDataParallel(model.linear)
    network.register_comm_hook(HookState(compression_params=params, lr=lambda: optimizer.param_groups[0]["lr"]),
                               byteps_hook)
else:
    network = model
    optimizer = bps.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression_params=params)
assert all(group["momentum"] == 0 for group in optimizer.param_groups) or params.get("momentum") != "nesterov"
data = torch.Generator().manual_seed(100 + bps.rank())
record = {f"{kind}_{name}": [] for kind in ("local", "synced") for name in NAMES}
record["lr"] = []
for _ in range(steps):
    x, y = torch.randn(8, 40, generator=data), torch.randn(8, 5, generator=data)
    optimizer.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    local = torch.autograd.grad(loss, trained, retain_graph=True)
    record["lr"].append(optimizer.param_groups[0]["lr"])
    loss = ((network(x) * model.gain - y) ** 2).mean() if hooked else loss  # DDP's forward marks what it reduces
    loss.backward()
    if not hooked:
        optimizer.synchronize()
    for name, p, gradient in zip(NAMES, trained, local):
        record[f"local_{name}"].append(gradient.numpy().copy())
        record[f"synced_{name}"].append(p.grad.numpy().copy())
    if not hooked:
        with optimizer.skip_synchronize():
            optimizer.step()
    else:
        optimizer.step()
    for group in optimizer.param_groups:
        group["lr"] *= 0.8
if not hooked:  # which gradients went fused, bucket by bucket
    record["fused"] = sorted(sorted(n for n, p in model.named_parameters() if any(p is q for q in bucket.members))
                             for plan in optimizer._plans.values() for bucket in set(plan.values()))
# the compression threads that ran codecs (BYTEPS_THREADPOOL_SIZE; none without)
record["pool_threads"] = [sum(t.name.startswith("byteps-compress") for t in threading.enumerate())]
np.savez(os.path.join(out_dir, f"rank{bps.rank()}.npz"), **{k: np.array(v) for k, v in record.items() if v})
print("OK recorded", steps, "steps")
bps.shutdown()
