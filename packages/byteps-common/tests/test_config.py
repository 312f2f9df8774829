"""Config.from_env: defaults, every variable, and errors that name the variable."""

import pytest

from byteps.common.config import Config, ConfigError, parse_cpu_sections

DISTRIBUTED = {"DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "9000", "DMLC_NUM_SERVER": "2"}


def test_defaults_are_a_single_local_worker():
    cfg = Config.from_env({})
    assert (cfg.role, cfg.num_worker, cfg.num_server, cfg.rank, cfg.size) == ("worker", 1, 0, 0, 1)
    assert cfg.partition_bytes == 512000 and cfg.server_engine_threads == 4
    assert not cfg.is_distributed and cfg.log_level == "WARNING" and cfg.ps_verbose == 0


def test_every_variable_is_read():
    cfg = Config.from_env({
        **DISTRIBUTED, "DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "3", "DMLC_WORKER_ID": "2",
        "DMLC_INTERFACE": "eth0", "DMLC_NODE_HOST": "10.0.0.7", "BYTEPS_LOCAL_RANK": "1",
        "BYTEPS_LOCAL_SIZE": "4", "BYTEPS_FORCE_DISTRIBUTED": "1", "BYTEPS_PARTITION_BYTES": "1024",
        "BYTEPS_SERVER_ENGINE_THREAD": "8", "BYTEPS_LOG_LEVEL": "info", "PS_VERBOSE": "2",
        "BYTEPS_RENDEZVOUS_TIMEOUT": "30", "DMLC_ENABLE_RDMA": "0",
        "PS_HEARTBEAT_INTERVAL": "0.5", "PS_HEARTBEAT_TIMEOUT": "4",
        "BYTEPS_STALL_CHECK_TIME": "30", "BYTEPS_STALL_SHUTDOWN_TIME": "120",
    })
    assert (cfg.root_uri, cfg.root_port, cfg.num_server, cfg.num_worker) == ("10.0.0.1", 9000, 2, 3)
    assert (cfg.interface, cfg.node_host, cfg.local_rank, cfg.local_size) == ("eth0", "10.0.0.7", 1, 4)
    assert cfg.rank == 2 * 4 + 1 and cfg.size == 12 and cfg.is_distributed and cfg.force_distributed
    assert (cfg.partition_bytes, cfg.server_engine_threads, cfg.log_level, cfg.ps_verbose) == (1024, 8, "INFO", 2)
    assert cfg.rendezvous_timeout_s == 30 and not cfg.enable_rdma
    assert (cfg.heartbeat_interval_s, cfg.heartbeat_timeout_s) == (0.5, 4.0)
    assert (cfg.stall_check_s, cfg.stall_shutdown_s) == (30.0, 120.0)


@pytest.mark.parametrize("env,variable,fragment", [
    ({"DMLC_ROLE": "boss"}, "DMLC_ROLE", "expected one of worker, server, scheduler"),
    ({"DMLC_NUM_WORKER": "two"}, "DMLC_NUM_WORKER", "expected an integer, got 'two'"),
    ({"DMLC_NUM_WORKER": "0"}, "DMLC_NUM_WORKER", "must be >= 1"),
    ({"DMLC_NUM_WORKER": "2", **DISTRIBUTED}, "DMLC_WORKER_ID", "not set; it is required for a worker"),
    ({"DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "2", **DISTRIBUTED}, "DMLC_WORKER_ID", "must be < DMLC_NUM_WORKER=2"),
    ({"DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "0"}, "DMLC_PS_ROOT_URI", "scheduler's IP address"),
    ({"DMLC_ROLE": "server", "DMLC_PS_ROOT_URI": "h", "DMLC_NUM_SERVER": "1"}, "DMLC_PS_ROOT_PORT", "not set"),
    ({"DMLC_ROLE": "server", **DISTRIBUTED, "DMLC_PS_ROOT_PORT": "70000"}, "DMLC_PS_ROOT_PORT", "must be <= 65535"),
    ({"DMLC_ROLE": "scheduler", **DISTRIBUTED, "DMLC_NUM_SERVER": "0", "DMLC_NUM_WORKER": "2"},
     "DMLC_NUM_SERVER", "must be >= 1"),
    ({"DMLC_ROLE": "server", **DISTRIBUTED, "DMLC_NUM_SERVER": "0"}, "DMLC_NUM_SERVER", "must be >= 1"),
    ({"BYTEPS_FORCE_DISTRIBUTED": "1", **DISTRIBUTED, "DMLC_NUM_SERVER": "0"}, "DMLC_NUM_SERVER", "must be >= 1"),
    ({"BYTEPS_LOCAL_SIZE": "2", "BYTEPS_LOCAL_RANK": "2"}, "BYTEPS_LOCAL_RANK", "must be < BYTEPS_LOCAL_SIZE=2"),
    ({"BYTEPS_FORCE_DISTRIBUTED": "maybe"}, "BYTEPS_FORCE_DISTRIBUTED", "expected 0 or 1"),
    ({"BYTEPS_PARTITION_BYTES": "-5"}, "BYTEPS_PARTITION_BYTES", "must be >= 1"),
    ({"BYTEPS_SERVER_ENGINE_THREAD": "x"}, "BYTEPS_SERVER_ENGINE_THREAD", "expected an integer"),
    ({"BYTEPS_LOG_LEVEL": "LOUD"}, "BYTEPS_LOG_LEVEL", "expected one of TRACE"),
    ({"PS_VERBOSE": "3"}, "PS_VERBOSE", "must be <= 2"),
    ({"PS_HEARTBEAT_INTERVAL": "soon"}, "PS_HEARTBEAT_INTERVAL", "expected a number of seconds"),
    ({"PS_HEARTBEAT_TIMEOUT": "-1"}, "PS_HEARTBEAT_TIMEOUT", "must be >= 0"),
    ({"BYTEPS_STALL_CHECK_TIME": "1m"}, "BYTEPS_STALL_CHECK_TIME", "expected a number of seconds"),
    ({"PS_HEARTBEAT_INTERVAL": "2", "PS_HEARTBEAT_TIMEOUT": "3"}, "PS_HEARTBEAT_TIMEOUT", "at least twice"),
])
def test_bad_values_name_the_variable(env, variable, fragment):
    with pytest.raises(ConfigError) as info:
        Config.from_env(env)
    assert info.value.variable == variable
    assert str(info.value).startswith(variable + ":") and fragment in str(info.value)


def test_single_worker_needs_no_scheduler_unless_forced():
    assert not Config.from_env({"DMLC_NUM_WORKER": "1"}).is_distributed
    with pytest.raises(ConfigError, match="DMLC_PS_ROOT_URI"):
        Config.from_env({"BYTEPS_FORCE_DISTRIBUTED": "1"})
    assert Config.from_env({"BYTEPS_FORCE_DISTRIBUTED": "1", **DISTRIBUTED}).is_distributed


def test_one_worker_machine_needs_no_server():
    cfg = Config.from_env({**DISTRIBUTED, "DMLC_NUM_SERVER": "0", "BYTEPS_LOCAL_SIZE": "2"})
    assert cfg.is_distributed and cfg.num_server == 0


def test_empty_values_count_as_unset():
    assert Config.from_env({"DMLC_ROLE": "", "BYTEPS_PARTITION_BYTES": "  "}).partition_bytes == 512000


def test_scheduling_fusion_assignment_and_placement_knobs():
    cfg = Config.from_env({
        "BYTEPS_SCHEDULING_CREDIT": "0", "BYTEPS_PIPELINE": "0", "BYTEPS_FUSION_THRESHOLD": "8192",
        "BYTEPS_FUSION_MAX_TENSOR_BYTES": "1024", "BYTEPS_KEY_HASH_FN": "SDBM", "BYTEPS_SERVER_ASSIGNMENT": "hash",
        "BYTEPS_NUMA_ON": "0", "BYTEPS_VISIBLE_CPU_CORES": "1,4-5,7-11,12:20-25", "BYTEPS_CPU_BLACKLIST": "0, 3-4",
        "BYTEPS_MULTITHREADED_CPU": "0", "BYTEPS_NUMA_DEFAULT_QUOTA": "6", "BYTEPS_PCIE_SWITCH_SIZE": "4",
        "BYTEPS_JOB_ID": "job.7_a", "BYTEPS_THREADPOOL_SIZE": "3",
    })
    assert (cfg.scheduling_credit, cfg.pipeline) == (0, False)
    assert (cfg.fusion_threshold, cfg.fusion_max_tensor_bytes) == (8192, 1024)
    assert (cfg.key_hash_fn, cfg.server_assignment) == ("sdbm", "hash")
    assert cfg.visible_cpu_cores == ((1, 4, 5, 7, 8, 9, 10, 11, 12), (20, 21, 22, 23, 24, 25))
    assert cfg.cpu_blacklist == (0, 3, 4) and not cfg.numa_on and not cfg.multithreaded_cpu
    assert (cfg.numa_default_quota, cfg.pcie_switch_size, cfg.job_id) == (6, 4, "job.7_a")
    assert cfg.threadpool_size == 3
    defaults = Config.from_env({})
    assert (defaults.scheduling_credit, defaults.pipeline, defaults.key_hash_fn) == (8, True, "djb2")
    assert defaults.visible_cpu_cores is None and defaults.cpu_blacklist == () and defaults.job_id is None
    assert defaults.threadpool_size == 0


@pytest.mark.parametrize("env,variable,fragment", [
    ({"BYTEPS_KEY_HASH_FN": "md5"}, "BYTEPS_KEY_HASH_FN", "expected one of djb2, sdbm, built_in"),
    ({"BYTEPS_SERVER_ASSIGNMENT": "random"}, "BYTEPS_SERVER_ASSIGNMENT", "expected one of balanced, hash"),
    ({"BYTEPS_SCHEDULING_CREDIT": "-1"}, "BYTEPS_SCHEDULING_CREDIT", "must be >= 0"),
    ({"BYTEPS_VISIBLE_CPU_CORES": "1,a"}, "BYTEPS_VISIBLE_CPU_CORES", "expected CPU ids"),
    ({"BYTEPS_VISIBLE_CPU_CORES": "1-3::4"}, "BYTEPS_VISIBLE_CPU_CORES", "section 1"),
    ({"BYTEPS_CPU_BLACKLIST": "5-2"}, "BYTEPS_CPU_BLACKLIST", "bad CPU range"),
    ({"BYTEPS_NUMA_DEFAULT_QUOTA": "0"}, "BYTEPS_NUMA_DEFAULT_QUOTA", "must be >= 1"),
    ({"BYTEPS_JOB_ID": "a/b"}, "BYTEPS_JOB_ID", "letters, digits"),
    ({"BYTEPS_THREADPOOL_SIZE": "-2"}, "BYTEPS_THREADPOOL_SIZE", "must be >= 0"),
    ({"BYTEPS_THREADPOOL_SIZE": "two"}, "BYTEPS_THREADPOOL_SIZE", "BYTEPS_THREADPOOL_SIZE"),
])
def test_bad_knobs_name_the_variable(env, variable, fragment):
    with pytest.raises(ConfigError) as info:
        Config.from_env(env)
    assert info.value.variable == variable and fragment in str(info.value)


# BYTEPS_VISIBLE_CPU_CORES: one CPU list per local worker (these came from the launcher's
# former cpu_affinity wrapper, which only called this parser).
@pytest.mark.parametrize(
    "text, expected",
    [
        ("1,4-5,7-11:20-25", [[1, 4, 5, 7, 8, 9, 10, 11], [20, 21, 22, 23, 24, 25]]),
        ("1,4-5,7-11,12:20-25", [[1, 4, 5, 7, 8, 9, 10, 11, 12], [20, 21, 22, 23, 24, 25]]),
        ("3", [[3]]),
        (" 2-3 , 0 ", [[0, 2, 3]]),
    ],
)
def test_parse_visible_cpu_cores(text, expected):
    assert [list(section) for section in parse_cpu_sections("BYTEPS_VISIBLE_CPU_CORES", text)] == expected


@pytest.mark.parametrize("text", ["", "1,,2", "a", "5-3", "1:", "-1", "1-x"])
def test_parse_visible_cpu_cores_rejects(text):
    with pytest.raises(ValueError, match="BYTEPS_VISIBLE_CPU_CORES"):
        parse_cpu_sections("BYTEPS_VISIBLE_CPU_CORES", text)


TWO_MACHINES = {**DISTRIBUTED, "DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "1"}


def test_training_mode_knobs_and_the_settings_every_node_shares():
    cfg = Config.from_env({**TWO_MACHINES, "BYTEPS_ENABLE_ASYNC": "1", "BYTEPS_ASYNC_MAX_STALENESS": "3",
                           "BYTEPS_SERVER_ENABLE_SCHEDULE": "1"})
    assert (cfg.enable_async, cfg.async_max_staleness, cfg.server_enable_schedule) == (True, 3, True)
    assert cfg.job_settings() == {"DMLC_ENABLE_RDMA": "0", "BYTEPS_ENABLE_ASYNC": "1",
                                  "BYTEPS_ASYNC_MAX_STALENESS": "3", "BYTEPS_BACKUP_WORKERS": "0",
                                  "BYTEPS_ROW_SPARSE": "1"}
    assert Config.from_env({**TWO_MACHINES, "BYTEPS_ROW_SPARSE": "0"}).job_settings()["BYTEPS_ROW_SPARSE"] == "0"
    assert Config.from_env({**TWO_MACHINES, "BYTEPS_BACKUP_WORKERS": "1"}).backup_workers == 1
    # A server does not know the job's size: its workers judge it
    assert Config.from_env({**DISTRIBUTED, "DMLC_ROLE": "server", "BYTEPS_BACKUP_WORKERS": "5"}).backup_workers == 5


@pytest.mark.parametrize("env,variable,fragment", [
    ({"BYTEPS_ENABLE_ASYNC": "1"}, "BYTEPS_ENABLE_ASYNC", "more than one worker process"),
    ({"BYTEPS_ENABLE_ASYNC": "1", "BYTEPS_LOCAL_SIZE": "2", **DISTRIBUTED}, "BYTEPS_ENABLE_ASYNC",
     "BYTEPS_FORCE_DISTRIBUTED=1"),
    ({"BYTEPS_ASYNC_MAX_STALENESS": "2", **TWO_MACHINES}, "BYTEPS_ASYNC_MAX_STALENESS", "BYTEPS_ENABLE_ASYNC=1"),
    ({"BYTEPS_ENABLE_ASYNC": "1", "BYTEPS_BACKUP_WORKERS": "1", **TWO_MACHINES}, "BYTEPS_BACKUP_WORKERS",
     "synchronous"),
    ({"BYTEPS_BACKUP_WORKERS": "2", **TWO_MACHINES}, "BYTEPS_BACKUP_WORKERS", "less than DMLC_NUM_WORKER=2"),
    ({"BYTEPS_BACKUP_WORKERS": "-1", **TWO_MACHINES}, "BYTEPS_BACKUP_WORKERS", ">= 0"),
    ({"BYTEPS_ASYNC_MAX_STALENESS": "x", "BYTEPS_ENABLE_ASYNC": "1", **TWO_MACHINES}, "BYTEPS_ASYNC_MAX_STALENESS",
     "integer"),
])
def test_training_mode_combinations_that_cannot_work_are_refused(env, variable, fragment):
    with pytest.raises(ConfigError) as info:
        Config.from_env(env)
    assert info.value.variable == variable and fragment in str(info.value)
