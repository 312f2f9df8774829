"""assign_cores on reconstructed multi-socket machines (tests/fixtures/sysfs) and on this machine."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from byteps.common.config import Config, ConfigError
from byteps.launcher.core_assignment import assign_cores
from byteps.launcher.topology import Gpu, Topology, read_topology

FIXTURES = Path(__file__).parent / "fixtures" / "sysfs"
MACHINES = ("xeon-gold-6248-2s", "epyc-7543-2s-nps4", "alder-lake-i9-12900k", "xeon-offline-cxl")


def machine(name: str, gpu_nodes=()) -> Topology:
    topo = read_topology(str(FIXTURES / name), gpus=False)
    gpus = tuple(Gpu(i, f"0000:{i:02x}:00.0", node, i // 8) for i, node in enumerate(gpu_nodes))
    return dataclasses.replace(topo, gpus=gpus)


def nodes_of(topo: Topology, cpus) -> set:
    return {topo.cpu(cpu).numa_node for cpu in cpus}


def check_exclusive(topo: Topology, assignment, count: int, blacklist=(), multithreaded=True) -> None:
    """The automatic mode's promises: non-empty, online, disjoint, whole cores, no blacklisted CPU."""
    assert assignment.mode == "automatic"
    assert len(assignment.cpus) == count
    seen = set()
    for cpus in assignment.cpus:
        assert cpus and list(cpus) == sorted(set(cpus))
        assert set(cpus) <= set(topo.online)
        assert not set(cpus) & seen, "two workers share a CPU"
        assert not set(cpus) & set(blacklist)
        seen.update(cpus)
        for cpu in cpus:
            siblings = set(topo.cpu(cpu).siblings) - set(blacklist)
            if multithreaded:
                assert siblings <= set(cpus), f"CPU {cpu} without its hyperthread sibling"
            else:
                assert siblings & set(cpus) == {cpu}, f"CPU {cpu} with its sibling although multithreading is off"


@pytest.mark.parametrize("name", MACHINES)
@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 8])
def test_every_machine_gets_an_exclusive_even_share(name, count):
    topo = machine(name)
    assignment = assign_cores(topo, Config(), workers=count)
    check_exclusive(topo, assignment, count)
    quota = len(topo.physical_cores()) // count
    for cpus in assignment.cpus:
        assert len({topo.cpu(cpu).siblings for cpu in cpus}) == quota


def test_workers_default_to_local_size():
    assignment = assign_cores(machine("xeon-gold-6248-2s"), Config(local_size=4))
    assert len(assignment.cpus) == 4


def test_two_workers_without_gpu_get_one_socket_each():
    topo = machine("xeon-gold-6248-2s")
    assignment = assign_cores(topo, Config(), workers=2)
    assert assignment.cpus == (tuple(range(0, 20)) + tuple(range(40, 60)), tuple(range(20, 40)) + tuple(range(60, 80)))
    assert "no GPU" in assignment.note


def test_epyc_without_gpu_spreads_over_sockets_then_nodes():
    topo = machine("epyc-7543-2s-nps4")
    two = assign_cores(topo, Config(), workers=2)
    assert [nodes_of(topo, cpus) for cpus in two.cpus] == [{0, 1, 2, 3}, {4, 5, 6, 7}]
    eight = assign_cores(topo, Config(), workers=8)
    assert [nodes_of(topo, cpus) for cpus in eight.cpus] == [{n} for n in range(8)]
    small = assign_cores(topo, Config(numa_default_quota=4), workers=2)
    assert [nodes_of(topo, cpus) for cpus in small.cpus] == [{0}, {4}]  # one per socket, not both on socket 0


def test_gpu_workers_get_cores_on_their_gpus_node():
    topo = machine("xeon-gold-6248-2s", gpu_nodes=[0, 0, 0, 0, 1, 1, 1, 1])
    assignment = assign_cores(topo, Config(), workers=8)
    check_exclusive(topo, assignment, 8)
    assert [nodes_of(topo, cpus) for cpus in assignment.cpus] == [{0}] * 4 + [{1}] * 4
    assert assignment.note == ""


def test_gpus_on_node_1_keep_both_workers_on_node_1():
    topo = machine("xeon-gold-6248-2s", gpu_nodes=[0, 0, 0, 0, 1, 1, 1, 1])
    assignment = assign_cores(topo, Config(numa_default_quota=10), workers=2, gpus=[4, 5])
    check_exclusive(topo, assignment, 2)
    assert [nodes_of(topo, cpus) for cpus in assignment.cpus] == [{1}, {1}]
    # the default quota (all 40 cores / 2) cannot fit twice on node 1: the second worker spills to node 0
    spilled = assign_cores(topo, Config(), workers=2, gpus=[4, 5])
    assert [nodes_of(topo, cpus) for cpus in spilled.cpus] == [{1}, {0}]


def test_dgx_like_epyc_workers_stay_on_their_gpus_socket():
    topo = machine("epyc-7543-2s-nps4", gpu_nodes=[3, 3, 1, 1, 7, 7, 5, 5])
    exact = assign_cores(topo, Config(numa_default_quota=4), workers=8)
    check_exclusive(topo, exact, 8)
    assert [nodes_of(topo, cpus) for cpus in exact.cpus] == [{3}, {3}, {1}, {1}, {7}, {7}, {5}, {5}]
    full = assign_cores(topo, Config(), workers=8)  # 8 cores each: a node's worth, so pairs spill nearby
    check_exclusive(topo, full, 8)
    for cpus, gpu_node in zip(full.cpus, [3, 3, 1, 1, 7, 7, 5, 5]):
        assert {n // 4 for n in nodes_of(topo, cpus)} == {gpu_node // 4}


def test_unknown_gpu_falls_back_to_the_even_spread():
    topo = machine("xeon-gold-6248-2s", gpu_nodes=[1])
    assignment = assign_cores(topo, Config(numa_default_quota=5), workers=3, gpus=[0, None, None])
    check_exclusive(topo, assignment, 3)
    assert nodes_of(topo, assignment.cpus[0]) == {1}
    with pytest.raises(ValueError, match="expected 3"):
        assign_cores(topo, Config(), workers=3, gpus=[0])


def test_blacklist_is_never_used():
    topo = machine("xeon-gold-6248-2s")
    blacklist = (0, 1, 2, 3, 40, 41, 20)
    assignment = assign_cores(topo, Config(cpu_blacklist=blacklist), workers=4)
    check_exclusive(topo, assignment, 4, blacklist=blacklist)
    assert 42 in assignment.cpus[0]  # core 2 keeps its unlisted thread


def test_blacklist_leaving_nothing_is_an_error_naming_it():
    topo = machine("alder-lake-i9-12900k")
    with pytest.raises(ConfigError, match="BYTEPS_CPU_BLACKLIST.*leaves no CPU") as info:
        assign_cores(topo, Config(cpu_blacklist=tuple(range(24))), workers=2)
    assert info.value.variable == "BYTEPS_CPU_BLACKLIST"


@pytest.mark.parametrize("name", MACHINES)
def test_multithreading_off_uses_one_thread_per_core(name):
    topo = machine(name)
    assignment = assign_cores(topo, Config(multithreaded_cpu=False), workers=2)
    check_exclusive(topo, assignment, 2, multithreaded=False)


def test_multithreading_off_on_adjacent_siblings():
    topo = machine("alder-lake-i9-12900k")
    assignment = assign_cores(topo, Config(multithreaded_cpu=False), workers=2)
    assert assignment.cpus == ((0, 2, 4, 6, 8, 10, 12, 14), tuple(range(16, 24)))
    both = assign_cores(topo, Config(), workers=2)
    assert both.cpus[0] == tuple(range(16))  # (0,1), (2,3)...: not BytePS's i and i+n


def test_quota_limits_each_worker():
    topo = machine("xeon-gold-6248-2s")
    assignment = assign_cores(topo, Config(numa_default_quota=6), workers=3)
    check_exclusive(topo, assignment, 3)
    assert [len(cpus) for cpus in assignment.cpus] == [12, 12, 12]


def test_quota_too_large_is_an_error_naming_it():
    topo = machine("xeon-gold-6248-2s")
    with pytest.raises(ConfigError, match=r"BYTEPS_NUMA_DEFAULT_QUOTA: 11 physical cores x 4 local workers = 44, "
                                          r"but only 40"):
        assign_cores(topo, Config(numa_default_quota=11), workers=4)


def test_more_workers_than_cores_share_the_usable_cpus():
    topo = machine("xeon-offline-cxl")
    assignment = assign_cores(topo, Config(cpu_blacklist=(0, 16)), workers=20)
    assert assignment.mode == "shared"
    usable = tuple(cpu for cpu in topo.online if cpu not in (0, 16))
    assert assignment.cpus == (usable,) * 20
    assert "20 local workers but only 14 usable physical cores" in assignment.note


def test_offline_cpus_are_never_assigned():
    topo = machine("xeon-offline-cxl")
    assignment = assign_cores(topo, Config(), workers=3)
    check_exclusive(topo, assignment, 3)
    assigned = {cpu for cpus in assignment.cpus for cpu in cpus}
    assert assigned == set(topo.online)  # 15 cores / 3 workers: all used, 6, 7 and 22 never
    assert 23 in assigned


def test_allowed_cpus_restrict_the_automatic_mode():
    topo = machine("xeon-gold-6248-2s")
    node1 = topo.node(1).cpus
    assignment = assign_cores(topo, Config(), workers=2, allowed=node1)
    check_exclusive(topo, assignment, 2)
    assert [nodes_of(topo, cpus) for cpus in assignment.cpus] == [{1}, {1}]
    with pytest.raises(ValueError, match="none of the CPUs"):
        assign_cores(topo, Config(), workers=2, allowed=[500])


def test_numa_off_pins_nobody():
    assignment = assign_cores(machine("xeon-gold-6248-2s"), Config(numa_on=False, visible_cpu_cores=((0,),)))
    assert assignment.mode == "off" and assignment.cpus is None
    assert assignment.for_worker(0) is None


def test_visible_cores_override_everything():
    topo = machine("xeon-gold-6248-2s")
    config = Config(visible_cpu_cores=((1, 4, 5, 7, 8, 9, 10, 11, 12), (20, 21, 22, 23, 24, 25)),
                    cpu_blacklist=(1, 20), multithreaded_cpu=False)
    assignment = assign_cores(topo, config, workers=2)
    assert assignment.mode == "visible"
    assert assignment.cpus == ((1, 4, 5, 7, 8, 9, 10, 11, 12), (20, 21, 22, 23, 24, 25))
    assert assignment.for_worker(1) == (20, 21, 22, 23, 24, 25)


def test_visible_cores_section_count_must_match():
    topo = machine("xeon-gold-6248-2s")
    config = Config(local_size=2, visible_cpu_cores=((0,), (1,), (2,)))
    with pytest.raises(ConfigError, match=r"BYTEPS_VISIBLE_CPU_CORES: has 3 sections but 2 local worker processes "
                                          r"run on this machine \(BYTEPS_LOCAL_SIZE\)"):
        assign_cores(topo, config)


def test_visible_cores_must_exist_and_be_allowed():
    topo = machine("xeon-offline-cxl")
    with pytest.raises(ConfigError, match="section 1 names CPU 6-7, not online") as info:
        assign_cores(topo, Config(visible_cpu_cores=((0,), (5, 6, 7))), workers=2)
    assert info.value.variable == "BYTEPS_VISIBLE_CPU_CORES"
    with pytest.raises(ConfigError, match="section 0 names CPU 200, not online"):
        assign_cores(topo, Config(visible_cpu_cores=((200,),)), workers=1)
    with pytest.raises(ConfigError, match="section 0 names CPU 3, outside the CPUs this process may use"):
        assign_cores(topo, Config(visible_cpu_cores=((2, 3),)), workers=1, allowed=[0, 1, 2])


def test_zero_workers_is_a_programming_error():
    with pytest.raises(ValueError, match="workers must be >= 1"):
        assign_cores(machine("xeon-gold-6248-2s"), Config(), workers=0)


# ---------------------------------------------------------- this machine


def test_this_machine_one_worker_per_core():
    topo = read_topology(gpus=False)
    allowed = os.sched_getaffinity(0)
    cores = [core for core in topo.physical_cores() if set(core) & allowed]
    assignment = assign_cores(topo, Config(), workers=len(cores), allowed=allowed)
    check_exclusive(topo, assignment, len(cores), blacklist=set(topo.online) - allowed)
    assert {cpu for cpus in assignment.cpus for cpu in cpus} == allowed & set(topo.online)


def test_this_machine_one_worker_gets_everything_allowed():
    allowed = os.sched_getaffinity(0)
    assignment = assign_cores(read_topology(gpus=False), Config(), workers=1, allowed=allowed)
    assert assignment.cpus == (tuple(sorted(allowed)),)
