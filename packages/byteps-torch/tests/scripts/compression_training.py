"""A few SGD steps of a linear model with DistributedOptimizer(compression_params=...), recorded per rank.

Usage: compression_training.py PARAMS_JSON OUT_DIR STEPS MOMENTUM [hook]

With ``hook``: torch's own DistributedDataParallel with byteps_hook and a
HookState (the bucket is the weight alone: the model has no bias).

Saves OUT_DIR/rank<r>.npz: each step's local gradients (what this rank
computed), the gradients DistributedOptimizer left after synchronize (what
the compressed round gave), and the learning rate each step pushed with
(it decays, so error feedback rescales). test_compression.py replays the
local gradients through byteps.testkit.compression_reference and compares.
"""

import json
import os
import sys

import numpy as np
import torch

import byteps.torch as bps

params, out_dir, steps, momentum = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
hooked = sys.argv[5:] == ["hook"]
bps.init()
torch.manual_seed(0)
model = torch.nn.Linear(40, 5, bias=not hooked)  # weight: 200 floats (compressed), bias: 5 (too small)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
if hooked:
    import torch.distributed as dist

    from byteps.torch.parallel import HookState, byteps_hook

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    dist.init_process_group("gloo", rank=bps.rank(), world_size=bps.size())
    network = torch.nn.parallel.DistributedDataParallel(model)
    network.register_comm_hook(HookState(compression_params=params, lr=lambda: optimizer.param_groups[0]["lr"]),
                               byteps_hook)
else:
    network = model
    optimizer = bps.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression_params=params)
assert all(group["momentum"] == 0 for group in optimizer.param_groups) or params.get("momentum") != "nesterov"
data = torch.Generator().manual_seed(100 + bps.rank())
record = {"local_weight": [], "local_bias": [], "synced_weight": [], "synced_bias": [], "lr": []}
for _ in range(steps):
    x, y = torch.randn(8, 40, generator=data), torch.randn(8, 5, generator=data)
    optimizer.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    local = torch.autograd.grad(loss, [p for p in model.parameters()], retain_graph=True)
    record["lr"].append(optimizer.param_groups[0]["lr"])
    loss = ((network(x) - y) ** 2).mean()  # DDP's forward marks the parameters its backward reduces
    loss.backward()
    if not hooked:
        optimizer.synchronize()
    record["local_weight"].append(local[0].numpy().copy())
    record["synced_weight"].append(model.weight.grad.numpy().copy())
    if not hooked:
        record["local_bias"].append(local[1].numpy().copy())
        record["synced_bias"].append(model.bias.grad.numpy().copy())
        with optimizer.skip_synchronize():
            optimizer.step()
    else:
        optimizer.step()
    for group in optimizer.param_groups:
        group["lr"] *= 0.8
np.savez(os.path.join(out_dir, f"rank{bps.rank()}.npz"), **{k: np.array(v) for k, v in record.items() if v})
print("OK recorded", steps, "steps")
bps.shutdown()
