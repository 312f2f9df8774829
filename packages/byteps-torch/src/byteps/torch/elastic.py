"""Elastic training for PyTorch: Horovod's ``hvd.elastic`` API over byteps' membership epochs.

Run under ``bpslaunch -np 3 --min-np 2 --max-np 3 python train.py``; a
worker lost mid-epoch costs the work since the last ``state.commit()``, and
the job goes on with the survivors (docs/elastic.md)::

    import byteps.torch as bps

    bps.init()
    model = ...
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    sampler = bps.elastic.ElasticSampler(dataset)
    state = bps.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    @bps.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader, start=state.batch):
                ...
                state.sampler.record_batch(state.batch, batch_size)
                state.commit()
            state.batch = 0
            state.sampler.set_epoch(state.epoch + 1)

    train(state)
"""

from __future__ import annotations

import copy
import math
import random
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from byteps.common.elastic import HostsUpdatedInterrupt, ObjectState, run_fn
from byteps.common.elastic import State as _State
from byteps.common.frontend.process import rank, size
from byteps.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters

__all__ = ["run", "TorchState", "ObjectState", "ElasticSampler", "State", "HostsUpdatedInterrupt"]

State = _State


def run(func: Any) -> Any:
    """Horovod's ``hvd.elastic.run``: ``func(state, ...)`` goes on across lost and added workers.

    ``func`` must not start with a collective of its own: a worker that joins
    late syncs the state first, and would wait for it forever.
    """
    return run_fn(func)


class ElasticSampler(torch.utils.data.Sampler):
    """Each rank's share of a dataset, shuffled per epoch, re-split when the membership changes.

    As Horovod's: the ranks record how many samples the whole job has
    processed this epoch (``record_batch``); after a change of membership
    the remaining samples are split over the new ranks, so none is seen
    twice and none is skipped. Call ``set_epoch(e + 1)`` at the end of each
    epoch. The order is ``random.Random(seed + epoch)`` shuffling, the same
    on every rank.
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``: a new order and nothing processed (call it at the end of the previous one)."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """One batch of ``batch_size`` done on every rank."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> Dict[str, int]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: Dict[str, int]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        """Split what is left of this epoch over the current ranks."""
        self.num_replicas = size()
        self.rank = rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        indices = list(self.remaining_indices)
        indices += indices[:self.total_size - len(indices)]  # padded to an equal share per rank
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


class _Handler:
    """One value with a ``state_dict``: saved as a deep copy, restored from another copy (an optimizer's
    ``load_state_dict`` may keep the tensors it is given, which its next step would change), synced its own way."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.save()

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self) -> None:
        raise NotImplementedError


class _ModelHandler(_Handler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))


#: Which values get a handler of their own; the rest are ObjectState attributes.
_HANDLERS: List[Tuple[type, type]] = [
    (torch.nn.Module, _ModelHandler),
    (torch.optim.Optimizer, _OptimizerHandler),
    (ElasticSampler, _SamplerHandler),
]


def _handler_for(value: Any) -> Optional[_Handler]:
    for kind, handler in _HANDLERS:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """Horovod's ``TorchState``: a model, an optimizer, ElasticSamplers and plain values (``epoch=0``).

    ``commit()`` copies them in memory; ``restore()`` loads the copies;
    ``sync()`` broadcasts rank 0's parameters, optimizer state, sampler
    positions and values. Assigning ``state.model = other`` tracks the new object.
    """

    def __init__(self, model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for name, value in kwargs.items():
            handler = _handler_for(value)
            if handler is not None:
                handlers[name] = handler
            else:
                plain[name] = value
        self._handlers = handlers
        for name, handler in handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers:
            handlers[name].value = value
        super().__setattr__(name, value)
