"""The one typed home of every byteps knob.

Every process of a job (scheduler, server, worker, launcher) reads its
settings through :class:`Config`, from the environment variables of
BytePS's env reference (``DMLC_*``, ``BYTEPS_*``, ``PS_*``), listed with
their defaults in :data:`ENV_DEFAULTS` and docs/configuration.md. A
missing or malformed value raises :class:`ConfigError`, which names the
variable and says what a good value looks like; command-line entry points
turn it into a message on stderr and exit status 2 (BytePS printed a line and
exited 0).

Example::

    from byteps.common.config import Config
    cfg = Config.from_env()          # reads os.environ
    if cfg.is_distributed: ...
"""

from __future__ import annotations

import dataclasses
import os
import re
from types import MappingProxyType
from typing import Callable, Dict, Mapping, Optional, Tuple, TypeVar

from byteps.transport import Context, RdmaSettings

__all__ = [
    "Config", "ConfigError", "ENV_DEFAULTS", "ROLES", "LOG_LEVELS", "KEY_HASH_FNS", "SERVER_ASSIGNMENTS",
    "parse_cpu_list", "parse_cpu_sections",
]

ROLES = ("worker", "server", "scheduler")
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")
# 512 KB rather than BytePS's 4096000: with partitions in flight on both directions of a slow NIC, a round
# ends about (partitions queued at a server) / bandwidth after the last push; measured on the 500 Mbit/s
# cluster rig: 2.25 s (4 MB), 1.85 s (1 MB), 1.775 s (512 KB) against the bound 1.60 s. The comm thread
# still moves 512 KB partitions at 2.5+ GB/s on loopback, more than a 10 Gbit/s NIC carries
# (docs/performance-notebook.md#scheduling-pipelined-partitions-within-a-credit-on-the-cluster-rig).
DEFAULT_PARTITION_BYTES = 512000
#: The receive limit of a payload is never below this (Config.max_partition_bytes).
MIN_PAYLOAD_LIMIT = 1 << 20
DEFAULT_SERVER_ENGINE_THREADS = 4
# A worker gives up on a job that does not assemble after this long; servers and the scheduler wait
# for late nodes as long as it takes unless BYTEPS_RENDEZVOUS_TIMEOUT is set (Config.rendezvous_timeout).
DEFAULT_WORKER_RENDEZVOUS_TIMEOUT_S = 120
# BytePS's BYTEPS_MIN_COMPRESS_BYTES: tensors smaller than this (whole-tensor bytes) go uncompressed.
DEFAULT_MIN_COMPRESS_BYTES = 65536
# BytePS's BYTEPS_THREADPOOL_SIZE: threads that compress and decompress partitions (0: the comm thread does).
DEFAULT_THREADPOOL_SIZE = 0
DEFAULT_HEARTBEAT_INTERVAL_S = 1.0
DEFAULT_HEARTBEAT_TIMEOUT_S = 10.0
DEFAULT_STALL_CHECK_S = 60.0
DEFAULT_SCHEDULING_CREDIT = 8
DEFAULT_FUSION_THRESHOLD = 4096000
DEFAULT_FUSION_MAX_TENSOR_BYTES = 65536
DEFAULT_PCIE_SWITCH_SIZE = 8
KEY_HASH_FNS = ("djb2", "sdbm", "built_in")
SERVER_ASSIGNMENTS = ("balanced", "hash")

#: Every variable :meth:`Config.from_env` reads, with the value it applies when the variable is unset or
#: empty (None: no value). A distributed job requires DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT and
#: DMLC_NUM_SERVER, and several worker machines DMLC_WORKER_ID, whatever this says. docs/configuration.md
#: documents the same names and defaults; tests/test_configuration_doc.py holds the two together.
ENV_DEFAULTS: Mapping[str, object] = MappingProxyType({
    # Job layout
    "DMLC_ROLE": "worker",
    "DMLC_NUM_WORKER": 1,
    "DMLC_NUM_SERVER": 0,
    "DMLC_WORKER_ID": 0,
    "DMLC_PS_ROOT_URI": None,
    "DMLC_PS_ROOT_PORT": None,
    "DMLC_INTERFACE": None,
    "DMLC_NODE_HOST": None,
    "BYTEPS_LOCAL_RANK": 0,
    "BYTEPS_LOCAL_SIZE": 1,
    "BYTEPS_FORCE_DISTRIBUTED": False,
    "DMLC_ENABLE_RDMA": False,
    "BYTEPS_RDMA_GID_INDEX": 0,
    # Performance
    "BYTEPS_PARTITION_BYTES": DEFAULT_PARTITION_BYTES,
    "BYTEPS_SERVER_ENGINE_THREAD": DEFAULT_SERVER_ENGINE_THREADS,
    "BYTEPS_SCHEDULING_CREDIT": DEFAULT_SCHEDULING_CREDIT,
    "BYTEPS_PIPELINE": True,
    "BYTEPS_FUSION_THRESHOLD": DEFAULT_FUSION_THRESHOLD,
    "BYTEPS_FUSION_MAX_TENSOR_BYTES": DEFAULT_FUSION_MAX_TENSOR_BYTES,
    "BYTEPS_SERVER_ASSIGNMENT": "balanced",
    "BYTEPS_KEY_HASH_FN": "djb2",
    "BYTEPS_MIN_COMPRESS_BYTES": DEFAULT_MIN_COMPRESS_BYTES,
    "BYTEPS_THREADPOOL_SIZE": DEFAULT_THREADPOOL_SIZE,
    "BYTEPS_SERVER_ENABLE_SCHEDULE": False,
    "BYTEPS_ENABLE_IPC": True,
    "BYTEPS_GPU_LOCAL_AGGREGATION": True,
    # Training mode (docs/async.md): every process of a job must agree on these
    "BYTEPS_ENABLE_ASYNC": False,
    "BYTEPS_ASYNC_MAX_STALENESS": None,
    "BYTEPS_BACKUP_WORKERS": 0,
    "BYTEPS_ROW_SPARSE": True,
    # Diagnostics and timeouts
    "BYTEPS_LOG_LEVEL": "WARNING",
    "PS_VERBOSE": 0,
    "PS_HEARTBEAT_INTERVAL": DEFAULT_HEARTBEAT_INTERVAL_S,
    "PS_HEARTBEAT_TIMEOUT": DEFAULT_HEARTBEAT_TIMEOUT_S,
    "BYTEPS_STALL_CHECK_TIME": DEFAULT_STALL_CHECK_S,
    "BYTEPS_STALL_SHUTDOWN_TIME": 0.0,
    "BYTEPS_JOB_SECRET": None,
    "BYTEPS_RENDEZVOUS_TIMEOUT": None,
    # CPU placement
    "BYTEPS_NUMA_ON": True,
    "BYTEPS_VISIBLE_CPU_CORES": None,
    "BYTEPS_NUMA_DEFAULT_QUOTA": None,
    "BYTEPS_CPU_BLACKLIST": (),
    "BYTEPS_MULTITHREADED_CPU": True,
    "BYTEPS_PCIE_SWITCH_SIZE": DEFAULT_PCIE_SWITCH_SIZE,
    # Timeline (docs/timeline.md)
    "BYTEPS_TRACE_ON": False,
    "BYTEPS_TRACE_START_STEP": 10,
    "BYTEPS_TRACE_END_STEP": 20,
    "BYTEPS_TRACE_DIR": "./trace",
    # Set by bpslaunch
    "BYTEPS_JOB_ID": None,
    "BYTEPS_REPORT_DIR": None,
    "BYTEPS_RESTART_COUNT": 0,
    "BYTEPS_SHUTDOWN_LEAVES_JOB": False,
})

T = TypeVar("T")


class ConfigError(ValueError):
    """A byteps environment variable is missing or malformed."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


def _parse_int(variable: str, raw: str, minimum: Optional[int] = None, maximum: Optional[int] = None) -> int:
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        raise ConfigError(variable, f"expected an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(variable, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(variable, f"must be <= {maximum}, got {value}")
    return value


def _parse_seconds(variable: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(variable, f"expected a number of seconds, got {raw!r}") from None
    if not value >= 0:  # also refuses nan
        raise ConfigError(variable, f"must be >= 0, got {raw!r}")
    return value


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse_bool(variable: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(variable, f"expected 0 or 1, got {raw!r}")


class _EnvReader:
    """Reads typed values from one environment mapping."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ

    def raw(self, variable: str) -> Optional[str]:
        value = self.environ.get(variable)
        return None if value is None or value.strip() == "" else value

    def get(self, variable: str, parse: Callable[[str, str], T]) -> T:
        """The parsed value of ``variable``, else its ENV_DEFAULTS entry (a KeyError for a name not there)."""
        default = ENV_DEFAULTS[variable]
        raw = self.raw(variable)
        return default if raw is None else parse(variable, raw)

    def require(self, variable: str, parse: Callable[[str, str], T], why: str) -> T:
        raw = self.raw(variable)
        if raw is None:
            raise ConfigError(variable, f"not set; it is required {why}")
        return parse(variable, raw)


def _int(minimum: Optional[int] = None, maximum: Optional[int] = None) -> Callable[[str, str], int]:
    return lambda variable, raw: _parse_int(variable, raw, minimum, maximum)


def _choice(choices: tuple, transform: Callable[[str], str]) -> Callable[[str, str], str]:
    def parse(variable: str, raw: str) -> str:
        value = transform(raw.strip())
        if value not in choices:
            raise ConfigError(variable, f"expected one of {', '.join(choices)}, got {raw!r}")
        return value

    return parse


def _text(variable: str, raw: str) -> str:
    return raw.strip()


def parse_cpu_list(variable: str, raw: str) -> Tuple[int, ...]:
    """Parse a Linux CPU list such as ``1,4-5,7-11`` into sorted, distinct CPU ids."""
    cpus = set()
    if not raw.strip():
        return ()
    for item in raw.strip().split(","):
        item = item.strip()
        if not item:
            raise ConfigError(variable, f"empty item in the CPU list {raw!r}")
        low, dash, high = item.partition("-")
        try:
            first = int(low, 10)
            last = int(high, 10) if dash else first
        except ValueError:
            raise ConfigError(variable, f"expected CPU ids like 1,4-5,7-11, got {raw!r}") from None
        if first < 0 or last < first:
            raise ConfigError(variable, f"bad CPU range {item!r} in {raw!r}")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def _job_id(variable: str, raw: str) -> str:
    value = raw.strip()
    if not re.fullmatch(r"[A-Za-z0-9_.]{1,40}", value):
        raise ConfigError(variable, f"expected 1-40 letters, digits, '_' or '.', got {raw!r}")
    return value


def parse_cpu_sections(variable: str, raw: str) -> Tuple[Tuple[int, ...], ...]:
    """BYTEPS_VISIBLE_CPU_CORES: one CPU list per local worker, separated by colons."""
    sections = tuple(parse_cpu_list(variable, section) for section in raw.strip().split(":"))
    for index, section in enumerate(sections):
        if not section:
            raise ConfigError(variable, f"section {index} of {raw!r} names no CPU")
    return sections


@dataclasses.dataclass(frozen=True)
class Config:
    """Settings of one byteps process, read from its environment."""

    role: str = "worker"
    num_worker: int = 1
    num_server: int = 0
    worker_id: int = 0
    root_uri: Optional[str] = None
    root_port: Optional[int] = None
    interface: Optional[str] = None
    node_host: Optional[str] = None
    local_rank: int = 0
    local_size: int = 1
    force_distributed: bool = False
    partition_bytes: int = DEFAULT_PARTITION_BYTES
    server_engine_threads: int = DEFAULT_SERVER_ENGINE_THREADS
    enable_rdma: bool = False
    rdma_gid_index: int = 0  # the GID of the RDMA port that queue pairs route by (RoCE v2: often 1 or 3)
    rendezvous_timeout_s: Optional[int] = None  # as set; see rendezvous_timeout for what applies
    heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    stall_check_s: float = DEFAULT_STALL_CHECK_S
    stall_shutdown_s: float = 0.0
    job_secret: Optional[str] = dataclasses.field(default=None, repr=False)
    log_level: str = "WARNING"
    ps_verbose: int = 0
    # Scheduling and fusion (docs/configuration.md)
    scheduling_credit: int = DEFAULT_SCHEDULING_CREDIT  # partitions in flight per worker; 0 = unbounded
    pipeline: bool = True  # False: push every partition, then pull (a measurement switch)
    fusion_threshold: int = DEFAULT_FUSION_THRESHOLD  # bytes of one fused buffer; 0 = no fusion
    fusion_max_tensor_bytes: int = DEFAULT_FUSION_MAX_TENSOR_BYTES  # larger tensors are never fused
    # Key to server assignment
    key_hash_fn: str = "djb2"
    server_assignment: str = "balanced"
    # Gradient compression (compression_params): smaller tensors are sent as they are
    min_compress_bytes: int = DEFAULT_MIN_COMPRESS_BYTES
    threadpool_size: int = DEFAULT_THREADPOOL_SIZE  # compression threads; 0: on the communication thread
    # Server-side scheduling: a server sums the waiting pushes of the earliest-declared tensors first
    server_enable_schedule: bool = False
    # Co-located fast path: large payloads to a server on this host go through shared memory, not TCP
    enable_ipc: bool = True
    # A CUDA tensor's local aggregation sums on the GPU through CUDA IPC (docs/gpu.md); 0: through host memory
    gpu_local_aggregation: bool = True
    # Sparse gradients (docs/sparse.md): False: the adapters reduce them as Horovod does (the gather)
    row_sparse: bool = True
    # Asynchronous training (BytePS's BYTEPS_ENABLE_ASYNC): parameter deltas added at the servers as they come
    enable_async: bool = False
    async_max_staleness: Optional[int] = None  # a worker at most this many steps ahead of the slowest; None: no bound
    # Backup workers: a synchronous averaging round closes once all worker machines but this many pushed
    backup_workers: int = 0
    # Timeline: trace the rounds (a tensor's count of push_pulls) start..end of every tensor into trace_dir
    trace_on: bool = False
    # Read by the scheduler (bpslaunch's role mode sets it): a worker's shutdown() leaves the job, as in BytePS,
    # so the job ends once every worker has shut down; otherwise shutdown() suspends for a later init() (Horovod)
    shutdown_leaves_job: bool = False
    trace_start_step: int = 10
    trace_end_step: int = 20
    trace_dir: str = "./trace"
    # Placement on the machine
    numa_on: bool = True
    visible_cpu_cores: Optional[Tuple[Tuple[int, ...], ...]] = None
    cpu_blacklist: Tuple[int, ...] = ()
    multithreaded_cpu: bool = True
    numa_default_quota: Optional[int] = None
    pcie_switch_size: int = DEFAULT_PCIE_SWITCH_SIZE
    # Names this job's shared-memory segments and local sockets (bpslaunch sets it; else the scheduler picks one)
    job_id: Optional[str] = None
    # Where each process leaves its figures for bpslaunch's summary line (bpslaunch sets it)
    report_dir: Optional[str] = None
    restart_count: int = 0  # bpslaunch --max-restarts: 0 on the first attempt of a job, then 1, 2, ...

    @property
    def rendezvous_timeout(self) -> Optional[float]:
        """Seconds this process waits for the job to assemble (None: as long as it takes).

        BYTEPS_RENDEZVOUS_TIMEOUT when set; otherwise a worker gives up after
        120 s, naming what was missing, while a server or the scheduler waits
        for late nodes indefinitely (they say every few seconds what for).
        """
        if self.rendezvous_timeout_s is not None:
            return float(self.rendezvous_timeout_s)
        return float(DEFAULT_WORKER_RENDEZVOUS_TIMEOUT_S) if self.role == "worker" else None

    @property
    def max_partition_bytes(self) -> int:
        """The largest payload a worker or server receives: one partition, and never less than 1 MiB, so that
        control messages and partitions of any size the job's processes use still fit."""
        return max(self.partition_bytes, MIN_PAYLOAD_LIMIT)

    @property
    def is_distributed(self) -> bool:
        """Whether this job needs the scheduler and servers.

        As in BytePS, a single worker process needs neither unless
        BYTEPS_FORCE_DISTRIBUTED is set. Several local processes need the
        scheduler (to find each other); with one worker machine they sum in
        shared memory and need servers only when forced.
        """
        return self.force_distributed or self.num_worker * self.local_size > 1

    @property
    def secret(self) -> Optional[bytes]:
        """The job secret as bytes for HMAC, or None when the job has none."""
        return self.job_secret.encode() if self.job_secret else None

    @property
    def rank(self) -> int:
        """Global rank of a worker process: worker machine, then local rank."""
        return self.worker_id * self.local_size + self.local_rank

    @property
    def size(self) -> int:
        """Number of worker processes in the job."""
        return self.num_worker * self.local_size

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> Config:
        """Read and validate a Config; raises ConfigError naming the variable."""
        env = _EnvReader(os.environ if environ is None else environ)
        role = env.get("DMLC_ROLE", _choice(ROLES, str.lower))
        num_worker = env.get("DMLC_NUM_WORKER", _int(1))
        local_size = env.get("BYTEPS_LOCAL_SIZE", _int(1))
        local_rank = env.get("BYTEPS_LOCAL_RANK", _int(0))
        if local_rank >= local_size:
            raise ConfigError(
                "BYTEPS_LOCAL_RANK",
                f"must be < BYTEPS_LOCAL_SIZE={local_size}, got {local_rank}",
            )
        force_distributed = env.get("BYTEPS_FORCE_DISTRIBUTED", _parse_bool)
        distributed = role != "worker" or force_distributed or num_worker * local_size > 1

        if role == "worker" and num_worker > 1:
            worker_id = env.require(
                "DMLC_WORKER_ID", _int(0), f"for a worker when DMLC_NUM_WORKER={num_worker} > 1"
            )
        else:
            worker_id = env.get("DMLC_WORKER_ID", _int(0))
        if worker_id >= num_worker:
            raise ConfigError("DMLC_WORKER_ID", f"must be < DMLC_NUM_WORKER={num_worker}, got {worker_id}")

        why = f"for a {role} in a distributed job"
        if distributed:
            root_uri = env.require("DMLC_PS_ROOT_URI", _text, why + " (the scheduler's IP address)")
            root_port = env.require("DMLC_PS_ROOT_PORT", _int(1, 65535), why + " (the scheduler's port)")
            num_server = env.require("DMLC_NUM_SERVER", _int(0), why)
        else:
            root_uri = env.get("DMLC_PS_ROOT_URI", _text)
            root_port = env.get("DMLC_PS_ROOT_PORT", _int(1, 65535))
            num_server = env.get("DMLC_NUM_SERVER", _int(0))
        # One worker machine sums in shared memory and needs no server, unless forced through them.
        needs_servers = role == "server" or force_distributed or num_worker > 1
        if distributed and needs_servers and num_server < 1:
            raise ConfigError("DMLC_NUM_SERVER", f"must be >= 1 {why}, got {num_server}")

        trace_on = env.get("BYTEPS_TRACE_ON", _parse_bool)
        trace_start = env.get("BYTEPS_TRACE_START_STEP", _int(1))
        trace_end = env.get("BYTEPS_TRACE_END_STEP", _int(1))
        if trace_on and trace_end <= trace_start:
            raise ConfigError("BYTEPS_TRACE_END_STEP",
                              f"must be > BYTEPS_TRACE_START_STEP={trace_start}, got {trace_end}")
        heartbeat_interval = env.get("PS_HEARTBEAT_INTERVAL", _parse_seconds)
        heartbeat_timeout = env.get("PS_HEARTBEAT_TIMEOUT", _parse_seconds)
        if heartbeat_interval > 0 and heartbeat_timeout < 2 * heartbeat_interval:
            raise ConfigError(
                "PS_HEARTBEAT_TIMEOUT",
                f"must be at least twice PS_HEARTBEAT_INTERVAL={heartbeat_interval:g}, got {heartbeat_timeout:g}")

        enable_async = env.get("BYTEPS_ENABLE_ASYNC", _parse_bool)
        max_staleness = env.get("BYTEPS_ASYNC_MAX_STALENESS", _int(0))
        backup_workers = env.get("BYTEPS_BACKUP_WORKERS", _int(0))
        _check_training_mode(role, num_worker, local_size, force_distributed, enable_async, max_staleness,
                             backup_workers)

        return cls(
            role=role,
            num_worker=num_worker,
            num_server=num_server,
            worker_id=worker_id,
            root_uri=root_uri,
            root_port=root_port,
            interface=env.get("DMLC_INTERFACE", _text),
            node_host=env.get("DMLC_NODE_HOST", _text),
            local_rank=local_rank,
            local_size=local_size,
            force_distributed=force_distributed,
            partition_bytes=env.get("BYTEPS_PARTITION_BYTES", _int(1)),
            server_engine_threads=env.get("BYTEPS_SERVER_ENGINE_THREAD", _int(1, 256)),
            enable_rdma=env.get("DMLC_ENABLE_RDMA", _parse_bool),
            rdma_gid_index=env.get("BYTEPS_RDMA_GID_INDEX", _int(0)),
            rendezvous_timeout_s=env.get("BYTEPS_RENDEZVOUS_TIMEOUT", _int(1)),
            heartbeat_interval_s=heartbeat_interval,
            heartbeat_timeout_s=heartbeat_timeout,
            stall_check_s=env.get("BYTEPS_STALL_CHECK_TIME", _parse_seconds),
            stall_shutdown_s=env.get("BYTEPS_STALL_SHUTDOWN_TIME", _parse_seconds),
            job_secret=env.get("BYTEPS_JOB_SECRET", _text),
            log_level=env.get("BYTEPS_LOG_LEVEL", _choice(LOG_LEVELS, str.upper)),
            ps_verbose=env.get("PS_VERBOSE", _int(0, 2)),
            scheduling_credit=env.get("BYTEPS_SCHEDULING_CREDIT", _int(0)),
            pipeline=env.get("BYTEPS_PIPELINE", _parse_bool),
            fusion_threshold=env.get("BYTEPS_FUSION_THRESHOLD", _int(0)),
            fusion_max_tensor_bytes=env.get("BYTEPS_FUSION_MAX_TENSOR_BYTES", _int(1)),
            row_sparse=env.get("BYTEPS_ROW_SPARSE", _parse_bool),
            key_hash_fn=env.get("BYTEPS_KEY_HASH_FN", _choice(KEY_HASH_FNS, str.lower)),
            server_assignment=env.get("BYTEPS_SERVER_ASSIGNMENT", _choice(SERVER_ASSIGNMENTS, str.lower)),
            numa_on=env.get("BYTEPS_NUMA_ON", _parse_bool),
            visible_cpu_cores=env.get("BYTEPS_VISIBLE_CPU_CORES", parse_cpu_sections),
            cpu_blacklist=env.get("BYTEPS_CPU_BLACKLIST", parse_cpu_list),
            multithreaded_cpu=env.get("BYTEPS_MULTITHREADED_CPU", _parse_bool),
            numa_default_quota=env.get("BYTEPS_NUMA_DEFAULT_QUOTA", _int(1)),
            pcie_switch_size=env.get("BYTEPS_PCIE_SWITCH_SIZE", _int(1)),
            job_id=env.get("BYTEPS_JOB_ID", _job_id),
            report_dir=env.get("BYTEPS_REPORT_DIR", _text),
            restart_count=env.get("BYTEPS_RESTART_COUNT", _int(0)),
            shutdown_leaves_job=env.get("BYTEPS_SHUTDOWN_LEAVES_JOB", _parse_bool),
            min_compress_bytes=env.get("BYTEPS_MIN_COMPRESS_BYTES", _int(0)),
            threadpool_size=env.get("BYTEPS_THREADPOOL_SIZE", _int(0, 256)),
            trace_on=trace_on,
            trace_start_step=trace_start,
            trace_end_step=trace_end,
            trace_dir=env.get("BYTEPS_TRACE_DIR", _text),
            server_enable_schedule=env.get("BYTEPS_SERVER_ENABLE_SCHEDULE", _parse_bool),
            enable_ipc=env.get("BYTEPS_ENABLE_IPC", _parse_bool),
            gpu_local_aggregation=env.get("BYTEPS_GPU_LOCAL_AGGREGATION", _parse_bool),
            enable_async=enable_async,
            async_max_staleness=max_staleness,
            backup_workers=backup_workers,
        )

    def transport_context(self) -> Context:
        """The transport context this process's endpoints come from: shared memory toward servers on this host
        (BYTEPS_ENABLE_IPC), or RDMA (DMLC_ENABLE_RDMA, on DMLC_INTERFACE's device; RdmaUnavailable here when
        it cannot run)."""
        rdma = RdmaSettings(self.interface, self.rdma_gid_index) if self.enable_rdma else None
        return Context(shared_memory=self.enable_ipc, rdma=rdma)

    def job_settings(self) -> Dict[str, str]:
        """The settings every process of a job must share, as their variables' values: the scheduler
        refuses a node whose settings differ from the first node's, naming the variable."""
        return {"DMLC_ENABLE_RDMA": "1" if self.enable_rdma else "0",
                "BYTEPS_ENABLE_ASYNC": "1" if self.enable_async else "0",
                "BYTEPS_ASYNC_MAX_STALENESS": "" if self.async_max_staleness is None else str(self.async_max_staleness),
                "BYTEPS_BACKUP_WORKERS": str(self.backup_workers),
                "BYTEPS_ROW_SPARSE": "1" if self.row_sparse else "0"}


def _check_training_mode(role: str, num_worker: int, local_size: int, force_distributed: bool, enable_async: bool,
                         max_staleness: Optional[int], backup_workers: int) -> None:
    """Refuse the combinations of BYTEPS_ENABLE_ASYNC, BYTEPS_ASYNC_MAX_STALENESS and BYTEPS_BACKUP_WORKERS
    that cannot work, before anything starts (docs/async.md)."""
    if max_staleness is not None and not enable_async:
        raise ConfigError("BYTEPS_ASYNC_MAX_STALENESS", "bounds asynchronous training: set BYTEPS_ENABLE_ASYNC=1 "
                          "too, or unset it")
    if enable_async and backup_workers:
        raise ConfigError("BYTEPS_BACKUP_WORKERS", "applies to synchronous training; unset it or "
                          "BYTEPS_ENABLE_ASYNC")
    if role != "worker":
        return  # a server or scheduler does not know the job's size; its workers check
    if enable_async and num_worker * local_size < 2:
        raise ConfigError("BYTEPS_ENABLE_ASYNC", "asynchronous training needs more than one worker process "
                          f"(DMLC_NUM_WORKER={num_worker}, BYTEPS_LOCAL_SIZE={local_size}); unset it")
    if enable_async and num_worker == 1 and not force_distributed:
        raise ConfigError("BYTEPS_ENABLE_ASYNC", "asynchronous training keeps the parameters on the servers; with "
                          "one worker machine set BYTEPS_FORCE_DISTRIBUTED=1 and DMLC_NUM_SERVER>=1 "
                          "(bpslaunch --force-distributed), or use several (bpslaunch --workers N)")
    if backup_workers >= num_worker:
        raise ConfigError("BYTEPS_BACKUP_WORKERS", f"must be less than DMLC_NUM_WORKER={num_worker} (the worker "
                          f"machines; a round needs at least one), got {backup_workers}")
