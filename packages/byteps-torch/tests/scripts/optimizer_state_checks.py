"""Worker script: broadcast_optimizer_state for every optimizer class in torch.optim.

Run under bpslaunch. The optimizers are enumerated from ``torch.optim`` at run
time, so one that a newer torch adds is tried too (with the default model
and the hyper-parameters its constructor accepts; ``NEEDS`` lists the few
that need another model or a closure). For each optimizer and each of two
starting points of the other ranks (a fresh optimizer with no state; one
that stepped on other data with other hyper-parameters), the root steps a
few times, every rank calls ``broadcast_optimizer_state(opt, root_rank=0)``
and then checks, against the root's optimizer rebuilt here from the same
seeds:

* ``state_dict()`` is equal: every state tensor (bit for bit, dtype, shape),
  scalar state such as ``step``, and every param_group hyper-parameter,
  including non-tensor ones, of the same type;
* after ``broadcast_parameters`` and one more identical step, parameters
  and state still equal the root's (the adopted state is usable).

A failure does not stop the run: every rank prints ``RESULT <name> ok`` or
``RESULT <name> FAIL <why>`` per optimizer, and the test reports them all.
"""

from __future__ import annotations

import dataclasses
import inspect
import traceback
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import nn

import byteps.torch as bps

ROOT = 0
#: Hyper-parameters of the root and of the other ranks; each optimizer takes those its constructor accepts.
ROOT_OPTIONS = dict(lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True, betas=(0.8, 0.95), amsgrad=True,
                    centered=True, etas=(0.4, 1.3), step_sizes=(1e-5, 10.0), history_size=4,
                    line_search_fn="strong_wolfe", lr_decay=0.01, initial_accumulator_value=0.1, lambd=1e-3,
                    t0=2.0, rho=0.8, alpha=0.9, momentum_decay=0.005, decoupled_weight_decay=True,
                    adjust_lr_fn="match_rms_adamw", beta2_decay=-0.7, maximize=False)
OTHER_OPTIONS = dict(lr=0.2, momentum=0.5, weight_decay=0.0, nesterov=False, betas=(0.7, 0.9), amsgrad=False,
                     centered=False, etas=(0.3, 1.5), step_sizes=(1e-6, 5.0), history_size=7,
                     line_search_fn=None, lr_decay=0.0, initial_accumulator_value=0.0, lambd=1e-4,
                     t0=1e6, rho=0.9, alpha=0.99, momentum_decay=0.004, decoupled_weight_decay=False,
                     adjust_lr_fn=None, beta2_decay=-0.8, maximize=True)


def dense_model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))


def matrix_model() -> nn.Module:
    """2-D parameters only (Muon refuses 1-D ones)."""
    return nn.Sequential(nn.Linear(4, 3, bias=False), nn.Tanh(), nn.Linear(3, 2, bias=False))


class SparseModel(nn.Module):
    """An embedding with sparse gradients (SparseAdam takes nothing else)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(6, 3, sparse=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = (x.abs() * 10).long().remainder(6)[:, 0]
        return self.embedding(rows) * x[:, :3]


@dataclasses.dataclass(frozen=True)
class Need:
    """What one optimizer needs beyond the defaults."""

    model: Callable[[], nn.Module] = dense_model
    closure: bool = False   # step(closure) re-evaluates the loss (LBFGS)


NEEDS: Dict[str, Need] = {
    "Muon": Need(model=matrix_model),
    "SparseAdam": Need(model=SparseModel),
    "LBFGS": Need(closure=True),
}


def optimizer_classes() -> List[type]:
    """Every optimizer class torch.optim exports, by name (the same order on every rank)."""
    found = {name: cls for name, cls in vars(torch.optim).items()
             if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer}
    return [found[name] for name in sorted(found)]


def build(cls: type, options: Dict[str, Any], seed: int):
    torch.manual_seed(seed)
    model = NEEDS.get(cls.__name__, Need()).model()
    accepted = inspect.signature(cls.__init__).parameters
    return model, cls(model.parameters(), **{k: v for k, v in options.items() if k in accepted})


def train(cls: type, model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(5, 4, generator=generator)

        def closure(x: torch.Tensor = x) -> torch.Tensor:
            optimizer.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            return loss

        if NEEDS.get(cls.__name__, Need()).closure:
            optimizer.step(closure)
        else:
            closure()
            optimizer.step()


def root_reference(cls: type):
    model, optimizer = build(cls, ROOT_OPTIONS, seed=1)
    train(cls, model, optimizer, 3, seed=11)
    return model, optimizer


def differences(actual: Any, expected: Any, where: str) -> List[str]:
    """Where ``actual`` differs from ``expected`` (types, tensors bit for bit, containers recursively)."""
    if type(actual) is not type(expected):
        return [f"{where}: {type(actual).__name__} {actual!r}, root has {type(expected).__name__} {expected!r}"]
    if isinstance(expected, torch.Tensor):
        if (actual.dtype, actual.shape, actual.layout) != (expected.dtype, expected.shape, expected.layout):
            return [f"{where}: {actual.dtype} {tuple(actual.shape)}, root has {expected.dtype} "
                    f"{tuple(expected.shape)}"]
        if not torch.equal(actual.to_dense() if actual.is_sparse else actual,
                           expected.to_dense() if expected.is_sparse else expected):
            return [f"{where}: values differ from the root's"]
        return []
    if isinstance(expected, dict):
        if sorted(map(str, actual)) != sorted(map(str, expected)):
            return [f"{where}: keys {sorted(map(str, actual))}, root has {sorted(map(str, expected))}"]
        return [d for key in expected for d in differences(actual[key], expected[key], f"{where}[{key!r}]")]
    if isinstance(expected, (list, tuple)):
        if len(actual) != len(expected):
            return [f"{where}: {len(actual)} items, root has {len(expected)}"]
        return [d for i, (a, e) in enumerate(zip(actual, expected)) for d in differences(a, e, f"{where}[{i}]")]
    return [] if actual == expected else [f"{where}: {actual!r}, root has {expected!r}"]


def try_optimizer(cls: type) -> Optional[str]:
    """None if every check passed for ``cls``, else why not (every rank makes the same collective calls)."""
    problems: List[str] = []
    for start in ("fresh", "stepped"):
        if bps.rank() == ROOT:
            model, optimizer = root_reference(cls)
        else:
            model, optimizer = build(cls, OTHER_OPTIONS, seed=100 + bps.rank())
            if start == "stepped":
                train(cls, model, optimizer, 1 + bps.rank(), seed=200 + bps.rank())
        try:
            bps.broadcast_optimizer_state(optimizer, root_rank=ROOT)
        except Exception as exc:
            # Raised on every rank alike (or the job would hang): the next optimizer starts in step.
            return f"{start}: broadcast_optimizer_state raised {type(exc).__name__}: {exc}"
        reference_model, reference = root_reference(cls)
        problems += differences(optimizer.state_dict(), reference.state_dict(), f"{start}: state_dict")
        bps.broadcast_parameters(model.state_dict(), root_rank=ROOT)
        try:
            train(cls, model, optimizer, 1, seed=300)
            train(cls, reference_model, reference, 1, seed=300)
        except Exception as exc:
            problems.append(f"{start}: a step after the broadcast raised {type(exc).__name__}: {exc}")
            continue
        problems += differences(model.state_dict(), reference_model.state_dict(), f"{start}: next step's model")
        problems += differences(optimizer.state_dict(), reference.state_dict(), f"{start}: next step's state")
    return "; ".join(problems[:6]) or None


def main() -> None:
    bps.init()
    for cls in optimizer_classes():
        try:
            why = try_optimizer(cls)
        except Exception:
            why = "the check itself raised: " + traceback.format_exc().replace("\n", " | ")
        print(f"RESULT {cls.__name__} " + ("ok" if why is None else f"FAIL {why}"), flush=True)
    bps.shutdown()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
