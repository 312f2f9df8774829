"""Partition plans: sizes, keys, server spread, limits."""

import pytest

from byteps.common.partition import MAX_PARTITIONS, PartitionPlan


def test_tensor_below_one_partition_is_one_key():
    plan = PartitionPlan.build(tensor_id=3, nbytes=100, itemsize=4, partition_bytes=4096000, num_servers=2)
    assert [(p.key, p.offset, p.nbytes, p.server) for p in plan.partitions] == [(3 << 16, 0, 100, 1)]


def test_partitions_cover_the_tensor_in_whole_elements():
    plan = PartitionPlan.build(tensor_id=1, nbytes=8 * 1001, itemsize=8, partition_bytes=1003, num_servers=3)
    sizes = [p.nbytes for p in plan.partitions]
    assert all(s % 8 == 0 for s in sizes) and sum(sizes) == 8 * 1001
    assert sizes[:-1] == [1000] * (len(sizes) - 1)  # 1003 rounded down to whole float64s
    assert [p.offset for p in plan.partitions] == [1000 * i for i in range(len(sizes))]
    assert [p.server for p in plan.partitions][:4] == [1, 2, 0, 1]
    assert [p.key & 0xFFFF for p in plan.partitions] == list(range(len(sizes)))


def test_partition_smaller_than_an_element_still_holds_one():
    plan = PartitionPlan.build(tensor_id=0, nbytes=24, itemsize=8, partition_bytes=3, num_servers=1)
    assert [p.nbytes for p in plan.partitions] == [8, 8, 8]


def test_empty_tensor_has_no_partitions():
    assert PartitionPlan.build(0, 0, 4, 4096000, 1).partitions == ()


def test_too_many_partitions_names_the_variable():
    with pytest.raises(ValueError, match="raise BYTEPS_PARTITION_BYTES"):
        PartitionPlan.build(0, 4 * (MAX_PARTITIONS + 1), 4, 4, 1)



def test_a_tensor_of_several_partitions_is_cut_into_a_multiple_of_the_server_count():
    plan = PartitionPlan.build(0, 10 * 1024000, 4, 1024000, 4)  # 10 partitions: cut into 12 equal ones
    sizes = [p.nbytes for p in plan.partitions]
    assert len(sizes) == 12 and max(sizes) - min(sizes) <= 4 * 12 and sum(sizes) == 10 * 1024000
