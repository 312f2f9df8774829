"""byteps as a Ray Train backend: ``BytePSTrainer`` and ``BytePSConfig`` (``pip install byteps-launcher[ray]``
plus ``ray[train]``).

::

    from ray.train import ScalingConfig
    from byteps.launcher.ray_train import BytePSConfig, BytePSTrainer

    def train_loop(config):
        import byteps.torch as bps
        bps.init()                      # the backend set the environment
        ...                             # DistributedOptimizer, ray.train.report(...), checkpoints as usual
        bps.shutdown()

    trainer = BytePSTrainer(train_loop, train_loop_config={"epochs": 10},
                            scaling_config=ScalingConfig(num_workers=4),
                            byteps_config=BytePSConfig(num_servers=2, cpus_per_server=1))
    result = trainer.fit()

Ray Train starts its workers as usual (``ScalingConfig``); when they start,
:class:`BytePSConfig`'s backend places the byteps scheduler and
``num_servers`` servers as actors (:func:`byteps.launcher.ray_executor.
start_services`) and gives every Ray Train worker its role environment (a
worker machine of its own, ``DMLC_WORKER_ID`` = its index in the worker
group). When Ray Train shuts the workers down, the servers go with them.
Failures, retries (``FailureConfig``), checkpoints and reporting are Ray
Train's own: a run Ray Train restarts gets a new byteps job.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, List, Optional

from ray.train import BackendConfig
from ray.train.backend import Backend

try:  # Ray Train V2 (the default since Ray 2.5x), as ray.train.torch.TorchTrainer uses
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
except ImportError:  # older Ray
    from ray.train.data_parallel_trainer import DataParallelTrainer

from byteps.launcher.ray_executor import _node_ip, start_services, stop_services, worker_environment

__all__ = ["BytePSConfig", "BytePSTrainer"]


def _set_environment(env: Dict[str, str]) -> None:
    os.environ.update(env)


@dataclasses.dataclass
class BytePSConfig(BackendConfig):
    """The byteps side of a Ray Train run: servers (CPU actors) and extra environment for every process."""

    num_servers: int = 1
    cpus_per_server: float = 1
    env: Dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def backend_cls(self):
        return _BytePSBackend


class _BytePSBackend(Backend):
    """Starts the scheduler and servers before the training loop, stops them with the workers."""

    def __init__(self) -> None:
        self.services: List[Any] = []

    def on_start(self, worker_group: Any, backend_config: BytePSConfig) -> None:
        if backend_config.num_servers < 1:
            raise ValueError(f"BytePSConfig.num_servers must be at least 1, got {backend_config.num_servers}")
        workers = len(worker_group)
        self.services, shared = start_services(workers, backend_config.num_servers, backend_config.cpus_per_server,
                                               backend_config.env)
        for rank in range(workers):
            ip = worker_group.execute_single(rank, _node_ip)
            worker_group.execute_single(rank, _set_environment, worker_environment(shared, rank, workers, ip))

    def on_shutdown(self, worker_group: Any, backend_config: BytePSConfig) -> None:
        stop_services(self.services)
        self.services = []


class BytePSTrainer(DataParallelTrainer):
    """Ray Train's data-parallel trainer with byteps as its backend (see the module docstring)."""

    def __init__(self, train_loop_per_worker: Callable[..., Any], *, byteps_config: Optional[BytePSConfig] = None,
                 **kwargs: Any) -> None:
        super().__init__(train_loop_per_worker, backend_config=byteps_config or BytePSConfig(), **kwargs)

