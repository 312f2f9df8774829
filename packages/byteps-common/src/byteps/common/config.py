"""The one typed home of every byteps knob.

Every process of a job (scheduler, server, worker, launcher) reads its
settings through :class:`Config`, from the environment variables documented
in BytePS's env reference (``DMLC_*``, ``BYTEPS_*``, ``PS_VERBOSE``). A
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
from typing import Callable, Mapping, Optional, TypeVar

__all__ = ["Config", "ConfigError", "ROLES", "LOG_LEVELS"]

ROLES = ("worker", "server", "scheduler")
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")
DEFAULT_PARTITION_BYTES = 4096000
DEFAULT_SERVER_ENGINE_THREADS = 4
DEFAULT_RENDEZVOUS_TIMEOUT_S = 120
DEFAULT_HEARTBEAT_INTERVAL_S = 1.0
DEFAULT_HEARTBEAT_TIMEOUT_S = 10.0
DEFAULT_STALL_CHECK_S = 60.0

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

    def get(self, variable: str, parse: Callable[[str, str], T], default: T) -> T:
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
    rendezvous_timeout_s: int = DEFAULT_RENDEZVOUS_TIMEOUT_S
    heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    stall_check_s: float = DEFAULT_STALL_CHECK_S
    stall_shutdown_s: float = 0.0
    job_secret: Optional[str] = dataclasses.field(default=None, repr=False)
    log_level: str = "WARNING"
    ps_verbose: int = 0

    @property
    def is_distributed(self) -> bool:
        """Whether this job needs the scheduler and servers.

        As in BytePS, a single worker process needs neither unless
        BYTEPS_FORCE_DISTRIBUTED is set. Until local aggregation lands,
        several local processes on one machine also reduce through servers.
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
        role = env.get("DMLC_ROLE", _choice(ROLES, str.lower), "worker")
        num_worker = env.get("DMLC_NUM_WORKER", _int(1), 1)
        local_size = env.get("BYTEPS_LOCAL_SIZE", _int(1), 1)
        local_rank = env.get("BYTEPS_LOCAL_RANK", _int(0), 0)
        if local_rank >= local_size:
            raise ConfigError(
                "BYTEPS_LOCAL_RANK",
                f"must be < BYTEPS_LOCAL_SIZE={local_size}, got {local_rank}",
            )
        force_distributed = env.get("BYTEPS_FORCE_DISTRIBUTED", _parse_bool, False)
        distributed = role != "worker" or force_distributed or num_worker * local_size > 1

        if role == "worker" and num_worker > 1:
            worker_id = env.require(
                "DMLC_WORKER_ID", _int(0), f"for a worker when DMLC_NUM_WORKER={num_worker} > 1"
            )
        else:
            worker_id = env.get("DMLC_WORKER_ID", _int(0), 0)
        if worker_id >= num_worker:
            raise ConfigError("DMLC_WORKER_ID", f"must be < DMLC_NUM_WORKER={num_worker}, got {worker_id}")

        why = f"for a {role} in a distributed job"
        if distributed:
            root_uri = env.require("DMLC_PS_ROOT_URI", _text, why + " (the scheduler's IP address)")
            root_port = env.require("DMLC_PS_ROOT_PORT", _int(1, 65535), why + " (the scheduler's port)")
            num_server = env.require("DMLC_NUM_SERVER", _int(0), why)
        else:
            root_uri = env.get("DMLC_PS_ROOT_URI", _text, None)
            root_port = env.get("DMLC_PS_ROOT_PORT", _int(1, 65535), None)
            num_server = env.get("DMLC_NUM_SERVER", _int(0), 0)
        if distributed and num_server < 1:
            raise ConfigError("DMLC_NUM_SERVER", f"must be >= 1 {why}, got {num_server}")

        heartbeat_interval = env.get("PS_HEARTBEAT_INTERVAL", _parse_seconds, DEFAULT_HEARTBEAT_INTERVAL_S)
        heartbeat_timeout = env.get("PS_HEARTBEAT_TIMEOUT", _parse_seconds, DEFAULT_HEARTBEAT_TIMEOUT_S)
        if heartbeat_interval > 0 and heartbeat_timeout < 2 * heartbeat_interval:
            raise ConfigError(
                "PS_HEARTBEAT_TIMEOUT",
                f"must be at least twice PS_HEARTBEAT_INTERVAL={heartbeat_interval:g}, got {heartbeat_timeout:g}")

        return cls(
            role=role,
            num_worker=num_worker,
            num_server=num_server,
            worker_id=worker_id,
            root_uri=root_uri,
            root_port=root_port,
            interface=env.get("DMLC_INTERFACE", _text, None),
            node_host=env.get("DMLC_NODE_HOST", _text, None),
            local_rank=local_rank,
            local_size=local_size,
            force_distributed=force_distributed,
            partition_bytes=env.get("BYTEPS_PARTITION_BYTES", _int(1), DEFAULT_PARTITION_BYTES),
            server_engine_threads=env.get(
                "BYTEPS_SERVER_ENGINE_THREAD", _int(1, 256), DEFAULT_SERVER_ENGINE_THREADS
            ),
            enable_rdma=env.get("DMLC_ENABLE_RDMA", _parse_bool, False),
            rendezvous_timeout_s=env.get(
                "BYTEPS_RENDEZVOUS_TIMEOUT", _int(1), DEFAULT_RENDEZVOUS_TIMEOUT_S
            ),
            heartbeat_interval_s=heartbeat_interval,
            heartbeat_timeout_s=heartbeat_timeout,
            stall_check_s=env.get("BYTEPS_STALL_CHECK_TIME", _parse_seconds, DEFAULT_STALL_CHECK_S),
            stall_shutdown_s=env.get("BYTEPS_STALL_SHUTDOWN_TIME", _parse_seconds, 0.0),
            job_secret=env.get("BYTEPS_JOB_SECRET", _text, None),
            log_level=env.get("BYTEPS_LOG_LEVEL", _choice(LOG_LEVELS, str.upper), "WARNING"),
            ps_verbose=env.get("PS_VERBOSE", _int(0, 2), 0),
        )
