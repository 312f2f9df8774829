"""Key to server assignment: BytePS's key hashes, the balanced assignment, plan memoization."""

import importlib.util
import math
import os
import pathlib
import subprocess
import sys

import pytest

from byteps.common.partition import PartitionPlan
from byteps.common.server_assignment import HASH_FNS, ServerAssigner, built_in, djb2, hash_server, key_hash, sdbm

REPO = pathlib.Path(__file__).resolve().parents[3]
PARTITION_BYTES = 4096000
MASK = 2 ** 64 - 1

# Computed by a 10-line C++ program (uint64_t arithmetic over std::to_string(key), and
# std::hash<std::string> from g++ 12's libstdc++, x86-64): key -> (djb2, sdbm, built_in).
KNOWN = {
    0: (177621, 48, 2297668033614959926),
    1: (177622, 49, 10159970873491820195),
    65536: (210653553582, 3850799628401345593, 243660463169716517),
    3 << 16 | 2: (6951376374012, 17050440749492477447, 3154972786391050308),
    123456789012345: (8314341353698586289, 8376526638981194936, 13184879723193374481),
    MASK: (12896208346501881852, 11348354852834836965, 8097035269031846835),
}


def gradient_bytes(model, order="forward"):
    """float32 gradient sizes of a model from benchmarks/cluster/workloads.py; forward = declaration order."""
    spec = importlib.util.spec_from_file_location("workloads_under_test", REPO / "benchmarks/cluster/workloads.py")
    workloads = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workloads)
    sizes = [4 * math.prod(shape) for _, shape in workloads.gradient_shapes(model)]  # backward order
    return sizes if order == "backward" else sizes[::-1]


def imbalance(load):
    return max(load) * len(load) / sum(load)


def placed(sizes, num_servers, mode="balanced", hash_fn="djb2"):
    assigner = ServerAssigner(num_servers, PARTITION_BYTES, mode, hash_fn)
    for tensor_id, nbytes in enumerate(sizes):
        assigner.plan(tensor_id, nbytes, 4)
    return assigner


def round_robin(sizes, num_servers):
    load = [0] * num_servers
    for tensor_id, nbytes in enumerate(sizes):
        for part in PartitionPlan.build(tensor_id, nbytes, 4, PARTITION_BYTES, num_servers).partitions:
            load[part.server] += part.nbytes
    return load


@pytest.mark.parametrize("key", sorted(KNOWN))
def test_hashes_match_the_cpp_values(key):
    assert (djb2(key), sdbm(key), built_in(key)) == KNOWN[key]
    assert [key_hash(key, fn) for fn in HASH_FNS] == list(KNOWN[key])


def test_string_hashes_follow_their_recurrences():
    for key in (5, 42, 1 << 16, 987654321, 1 << 40):
        digits = [ord(c) for c in str(key)]
        h33, h65599 = 5381, 0
        for c in digits:
            h33 = ((h33 << 5) + h33 + c) & MASK
            h65599 = (c + (h65599 << 6) + (h65599 << 16) - h65599) & MASK
        assert djb2(key) == h33 and sdbm(key) == h65599


def test_hash_server_is_the_hash_modulo_the_servers():
    for key in (0, 7 << 16, 7 << 16 | 3, 12345):
        for fn in HASH_FNS:
            assert hash_server(key, 5, fn) == key_hash(key, fn) % 5
    with pytest.raises(ValueError, match="BYTEPS_KEY_HASH_FN"):
        key_hash(1, "md5")


def test_hashes_do_not_depend_on_the_interpreter_run():
    code = ("from byteps.common.server_assignment import ServerAssigner as S\n"
            "a = S(4, 1000, 'hash', 'built_in'); b = S(3, 1000)\n"
            "print([p.server for i in range(20) for p in a.plan(i, 4 * (i * 97 + 1), 4).partitions],"
            " [p.server for i in range(20) for p in b.plan(i, 4 * (i * 97 + 1), 4).partitions])")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(runs) == 1


def test_balanced_resnet50_over_4_servers_is_within_10_percent():
    figures = {}
    for order in ("forward", "backward"):
        sizes = gradient_bytes("resnet50", order)
        figures[order, "round-robin"] = imbalance(round_robin(sizes, 4))
        for fn in HASH_FNS:
            figures[order, fn] = imbalance(placed(sizes, 4, "hash", fn).load())
        figures[order, "balanced"] = imbalance(placed(sizes, 4).load())
    print("\nResNet-50, 4 servers, busiest/mean:",
          ", ".join(f"{order} {method} {value:.3f}" for (order, method), value in figures.items()))
    assert figures["forward", "balanced"] <= 1.1 and figures["backward", "balanced"] <= 1.1
    # What the balanced assignment is for: every hash placement misses the bound here (round-robin
    # meets it only because large tensors are cut into a multiple of the server count).
    assert all(figures["backward", m] > 1.1 for m in HASH_FNS)


@pytest.mark.parametrize("model", ["vgg16", "bert-base"])
@pytest.mark.parametrize("num_servers", [2, 4, 8])
def test_balanced_other_models(model, num_servers):
    sizes = gradient_bytes(model)
    balanced = imbalance(placed(sizes, num_servers).load())
    others = {fn: imbalance(placed(sizes, num_servers, "hash", fn).load()) for fn in HASH_FNS}
    others["round-robin"] = imbalance(round_robin(sizes, num_servers))
    print(f"\n{model}, {num_servers} servers, busiest/mean: balanced {balanced:.3f}, "
          + ", ".join(f"{m} {v:.3f}" for m, v in others.items()))
    assert balanced <= 1.1
    assert balanced <= min(others.values()) + 1e-9


def test_balanced_assigner_puts_each_partition_on_the_least_loaded_server():
    assigner = ServerAssigner(3, 100)
    assert [p.server for p in assigner.plan(0, 250, 1).partitions] == [0, 1, 2]   # 100, 100, 50
    assert assigner.load() == [100, 100, 50]
    assert [p.server for p in assigner.plan(1, 40, 4).partitions] == [2]
    assert [p.server for p in assigner.plan(2, 10, 2).partitions] == [2]         # 90 < 100: still 2
    assert [p.server for p in assigner.plan(3, 30, 1).partitions] == [0]         # ties: lowest index
    assert assigner.load() == [130, 100, 100]


def test_ties_spread_a_tensor_over_servers():
    assigner = ServerAssigner(4, 100)
    assigner.plan(0, 200, 200)                 # one 200-byte element: a single partition, on server 0
    for tensor_id in (1, 2, 3):
        assigner.plan(tensor_id, 300, 300)     # on servers 1, 2, 3
    assert assigner.load() == [200, 300, 300, 300]
    # After its first partition on 0, all four tie at 300: lowest index alone would take 0 again.
    assert [p.server for p in assigner.plan(4, 400, 1).partitions] == [0, 1, 2, 3]


def test_balance_comes_before_spreading():
    assigner = ServerAssigner(4, 100)
    for tensor_id in range(3):
        assigner.plan(tensor_id, 300, 300)   # one 300-byte element: a single partition, on 0, 1, 2
    assert [p.server for p in assigner.plan(3, 400, 1).partitions] == [3, 3, 3, 0]
    assert assigner.load() == [400, 300, 300, 300]


def test_plans_are_memoized_and_sizes_fixed():
    assigner = ServerAssigner(2, 1000)
    plan = assigner.plan(5, 4000, 4)
    assert assigner.plan(5, 4000, 4) is plan
    assert assigner.plan(5, 4000, 4, balanced=False) is plan
    assert assigner.load() == [2000, 2000]   # counted once
    with pytest.raises(ValueError, match=r"tensor 5 was planned with 4000 bytes of 4-byte elements, "
                                         r"now it has 8000 bytes of 4-byte elements"):
        assigner.plan(5, 8000, 4)
    with pytest.raises(ValueError, match="4000 bytes of 2-byte elements"):
        assigner.plan(5, 4000, 2)


def test_hash_mode_places_every_partition_by_its_key():
    for fn in HASH_FNS:
        assigner = ServerAssigner(4, 1000, "hash", fn)
        for tensor_id in range(10):
            plan = assigner.plan(tensor_id, 3500, 4, balanced=True)   # hash mode ignores balanced
            assert [p.server for p in plan.partitions] == [hash_server(p.key, 4, fn) for p in plan.partitions]
            assert [p.nbytes for p in plan.partitions] == [1000, 1000, 1000, 500]


def test_sizeless_tensors_are_hashed_and_do_not_steer_the_balance():
    # Worker A plans the sizeless tensor 1 before declaring 2 and 3; worker B after. Same plans.
    a, b = ServerAssigner(3, 100), ServerAssigner(3, 100)
    a.plan(0, 500, 4)
    b.plan(0, 500, 4)
    sizeless = a.plan(1, 700, 4, balanced=False)
    a.plan(2, 300, 4)
    a.plan(3, 120, 4)
    b.plan(2, 300, 4)
    b.plan(3, 120, 4)
    assert b.plan(1, 700, 4, balanced=False) == sizeless
    assert [p.server for p in sizeless.partitions] == [hash_server(p.key, 3) for p in sizeless.partitions]
    assert all(a.plan(t, s, 4) == b.plan(t, s, 4) for t, s in ((0, 500), (2, 300), (3, 120)))
    assert a.load() == b.load() and sum(a.load()) == 500 + 700 + 300 + 120


def _workers_that_disagree_on_tensor_1():
    """Two workers' assigners after tensor 0 (100 bytes) and tensor 1, 40 bytes on one and 160 on the other."""
    a, b = ServerAssigner(2, 1000), ServerAssigner(2, 1000)
    for assigner, size in ((a, 40), (b, 160)):
        assert [p.server for p in assigner.plan(0, 100, 4).partitions] == [0]
        assert [p.server for p in assigner.plan(1, size, 4).partitions] == [1]
    return a, b


def test_a_size_the_workers_disagree_on_leaves_the_balance_once_its_first_round_failed():
    # Found by MXNet's 2 machines x 2 processes job: after a reducescatter whose ranks disagreed on the
    # shape (failed on every rank), the next tensors went to different servers on each machine and hung.
    a, b = _workers_that_disagree_on_tensor_1()
    assert a.plan(2, 10, 4).partitions[0].server != b.plan(2, 10, 4).partitions[0].server  # what went wrong
    a, b = _workers_that_disagree_on_tensor_1()
    for assigner in (a, b):
        assigner.unbalance(1)
        assigner.unbalance(1)   # once
        assigner.unbalance(7)   # never planned: nothing
    assert a.plan(2, 10, 4) == b.plan(2, 10, 4) and a.plan(3, 500, 4) == b.plan(3, 500, 4)
    assert a.plan(1, 40, 4).partitions[0].server == 1   # its plan stays
    assert a.export()["balanced"] == b.export()["balanced"] == [100, 10 + 500]


def test_a_failed_first_round_unbalances_its_tensor_and_a_lost_job_does_not():
    from byteps.common.engine.task_maker import TrackedHandle
    from byteps.common.handle import JobLost
    from byteps.common.tensor_registry import TensorRegistry

    registry = TensorRegistry(ServerAssigner(2, 1000))
    for name, size in (("a", 100), ("b", 40), ("c", 30)):
        tensor_id, round_, _ = registry.begin(name, 0, None, size, 4)
        handle = TrackedHandle(name, None, registry, tensor_id, round_ == 0)
        if name == "a":
            handle.set_done()
        else:  # b: ranks disagreed; c: the job was lost, which the other ranks' tensors in flight may not share
            handle.set_error(ValueError("mismatch") if name == "b" else JobLost("gone"))
    assert registry.assigner.export()["balanced"] == [100, 30]
    tensor_id, round_, _ = registry.begin("b", 0, None, 40, 4)   # retired: declared afresh, balanced again
    assert (tensor_id, round_) == (3, 0) and registry.assigner.export()["balanced"] == [100, 70]
    TrackedHandle("b", None, registry, tensor_id, True).set_done()
    tensor_id, round_, _ = registry.begin("b", 0, None, 40, 4)
    TrackedHandle("b", None, registry, tensor_id, round_ == 0).set_error(ValueError("a later round"))
    assert registry.assigner.export()["balanced"] == [100, 70]
    assert registry.begin("b", 0, None, 40, 4)[:2] == (3, 2)   # a later round's failure retires nothing


def test_a_retired_name_is_forgotten_by_its_listeners_and_declared_in_order_not_derived():
    from byteps.common.engine.task_maker import TrackedHandle
    from byteps.common.tensor_registry import TensorRegistry

    registry = TensorRegistry(ServerAssigner(2, 1000))
    heard = []
    registry.on_retire(heard.append)
    registry.on_retire(heard.append)   # once
    base = registry.begin("w", 0, None, 16, 4)[0]
    TrackedHandle("w", None, registry, base, False).set_done()
    variant = registry.derived_id("w", 1)
    tensor_id, round_, _ = registry.begin("w#1", 0, variant, 12, 4)
    TrackedHandle("w#1", None, registry, tensor_id, round_ == 0).set_error(ValueError("the ranks disagreed"))
    assert heard == ["w#1"] and registry.retired("w#1") and not registry.declared("w#1")
    assert registry.begin("w#1", 0, None, 20, 4)[:2] == (1, 0)   # the next id in order, its new size
    assert "w#1" in registry.export()["retired"]


def test_identical_declarations_give_identical_plans():
    sizes = gradient_bytes("bert-base")
    first, second = placed(sizes, 4), placed(sizes, 4)
    assert all(first.plan(i, s, 4) == second.plan(i, s, 4) for i, s in enumerate(sizes))


def test_empty_tensor_and_bad_arguments():
    assigner = ServerAssigner(2, 1000)
    assert assigner.plan(0, 0, 4).partitions == () and assigner.load() == [0, 0]
    with pytest.raises(ValueError, match="BYTEPS_SERVER_ASSIGNMENT"):
        ServerAssigner(2, 1000, mode="random")
    with pytest.raises(ValueError, match="BYTEPS_KEY_HASH_FN"):
        ServerAssigner(2, 1000, hash_fn="crc32")
    with pytest.raises(ValueError, match="at least one server"):
        ServerAssigner(0, 1000)


def test_partition_plan_takes_a_server_choice():
    plan = PartitionPlan.build(2, 10, 1, 4, 3, servers=lambda key, nbytes: nbytes % 3)
    assert [(p.key, p.nbytes, p.server) for p in plan.partitions] == [
        (2 << 16, 4, 1), (2 << 16 | 1, 4, 1), (2 << 16 | 2, 2, 2)]
    with pytest.raises(ValueError, match="placed on server 3, but there are 3"):
        PartitionPlan.build(2, 10, 1, 4, 3, servers=lambda key, nbytes: 3)
