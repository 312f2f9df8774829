"""Hello, byteps: every worker allreduces a tensor of its rank + 1; each gets back the average.

    bpslaunch -np 2 -- python examples/torch/hello_allreduce.py
"""

import torch

import byteps.torch as bps

bps.init()
mine = torch.full((4,), float(bps.rank() + 1))
mean = bps.allreduce(mine, name="hello")              # averaged over all workers: mean of 1, 2, ..., size
expected = (bps.size() + 1) / 2
assert torch.equal(mean, torch.full((4,), expected)), f"rank {bps.rank()}: got {mean}, expected {expected}"
print(f"rank {bps.rank()} of {bps.size()}: mean {mean[0].item()}, expected {expected}")
bps.shutdown()
