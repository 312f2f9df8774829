"""The verbs stand-in refuses what RDMA hardware refuses: each rule, with the careless use it catches.

The stand-in (byteps.testkit.verbs_stand_in) replaces only the RDMA device
that no machine here has. These tests hold it to the provider's rules, so
that the transport's tests against it mean something: each one does what a
careless endpoint would do and shows it fail, then does it right.
"""

import threading
import time

import numpy as np
import pytest

from byteps.testkit.verbs_stand_in import ERROR, INIT, RTS, Rules, StandInDevice, VerbsError
from byteps.transport import NodeFailure


def connected(**rules):
    """A device with two queue pairs connected to each other, a source region and a target region."""
    device = StandInDevice(None, 0, Rules(**rules))
    one, two = device.queue_pair(), device.queue_pair()
    one.connect(two.info())
    two.connect(one.info())
    source, target = device.allocate(1 << 16), device.allocate(1 << 16)
    source.view[:] = np.arange(1 << 16, dtype=np.uint8).tobytes()
    return device, one, two, source, target


def test_an_inline_write_over_max_inline_data_is_refused():
    device, one, _, source, target = connected(max_inline_data=64)
    # careless: a 16 MB payload's page list (1,024 bytes) returned inline, as the transport once did
    with pytest.raises(VerbsError, match="inline write of 1024 bytes: max_inline_data is 64"):
        one.post(source, 0, 1024, target.address, target.rkey, inline=True)
    device.completions.wait(one.post(source, 0, 64, target.address, target.rkey, inline=True), one.peer)
    assert bytes(target.view[:64]) == bytes(source.view[:64])
    device.close()


def test_a_queue_pair_posts_only_in_rts_and_writes_only_to_a_peer_that_receives():
    device = StandInDevice(None, 0, Rules())
    early, late = device.queue_pair(), device.queue_pair()
    source, target = device.allocate(4096), device.allocate(4096)
    assert early.state == INIT
    with pytest.raises(VerbsError, match="a queue pair sends only in RTS"):  # careless: post before connecting
        early.post(source, 0, 8, target.address, target.rkey)
    early.connect(late.info())
    assert early.state == RTS
    with pytest.raises(VerbsError, match="only from INIT"):
        early.connect(late.info())
    # careless: write to a peer whose queue pair is not yet connected (the listener's rule 4, broken)
    with pytest.raises(NodeFailure, match="IBV_WC_RETRY_EXC_ERR"):
        early.write(source, 0, 8, target.address, target.rkey)
    assert early.state == ERROR  # a failed work request breaks its queue pair
    with pytest.raises(NodeFailure, match="could not be posted"):
        early.write(source, 0, 8, target.address, target.rkey)
    device.close()


def test_a_write_is_placed_and_completed_only_later_than_its_post():
    device, one, _, source, target = connected()
    with device.hold():
        wr_id = one.post(source, 0, 4096, target.address, target.rkey)
        # careless: read the target (or reuse the source) right after posting
        assert bytes(target.view[:4096]) == bytes(4096)
        assert device.ring.poll() == []
    device.completions.wait(wr_id, one.peer)
    assert bytes(target.view[:4096]) == bytes(source.view[:4096])
    device.close()


def test_completions_of_several_queue_pairs_arrive_out_of_posted_order():
    device, one, two, source, target = connected(order="reverse")
    with device.hold():
        first = one.post(source, 0, 8, target.address, target.rkey)
        second = two.post(source, 8, 8, target.address + 8, target.rkey)
    while device.ring.produced() < 2:
        device.ring.idle(0)
    # careless: take the first completion on the shared queue for the first post
    assert [entry[0] for entry in device.ring.poll()] == [second, first]
    # right: every waiter takes its own, whoever polls
    device2, one, two, source, target = connected(order="reverse")
    with device2.hold():
        ids = [one.post(source, 0, 8, target.address, target.rkey), two.post(source, 0, 8, target.address, target.rkey)]
        waiters = [threading.Thread(target=device2.completions.wait, args=(wr_id, "x")) for wr_id in ids]
        for waiter in waiters:
            waiter.start()
    for waiter in waiters:
        waiter.join()
    assert device2.completions._done == {}
    device.close()
    device2.close()


def test_a_completion_queue_that_is_not_polled_overruns():
    device, one, _, source, target = connected(cq_entries=4)
    with device.hold():  # careless: five signaled writes, nobody polls
        ids = [one.post(source, 0, 8, target.address, target.rkey) for _ in range(5)]
    while device.ring.produced() < 5:
        device.ring.idle(0)
    with pytest.raises(NodeFailure, match="completion queue overran"):
        device.completions.wait(ids[0], one.peer)
    assert one.state == ERROR
    device.close()


def test_a_send_queue_fills_until_a_signaled_completion_is_polled():
    device, one, _, source, target = connected(max_send_wr=8)
    for _ in range(8):  # careless: unsignaled writes only (a signal every 64th, on a queue of 8)
        one.post(source, 0, 8, target.address, target.rkey, signaled=False)
    with pytest.raises(VerbsError, match="the send queue is full"):
        one.post(source, 0, 8, target.address, target.rkey, signaled=True)
    device2, one, _, source, target = connected(max_send_wr=8)
    for _ in range(3):  # right: the last of every 8 is signaled and its completion polled
        for index in range(8):
            wr_id = one.post(source, 0, 8, target.address, target.rkey, signaled=index == 7)
        device2.completions.wait(wr_id, one.peer)
        assert one.outstanding == 0
    device.close()
    device2.close()


def test_remote_addresses_are_the_peers_and_checked_against_its_region():
    device, one, _, source, target = connected()
    # careless: an offset where the peer's address is due (what the old stand-in accepted)
    with pytest.raises(NodeFailure, match="IBV_WC_REM_ACCESS_ERR"):
        one.write(source, 0, 8, 0, target.rkey)
    device2, one, _, source, target = connected()
    with pytest.raises(NodeFailure, match="IBV_WC_REM_ACCESS_ERR"):  # past the region's end
        one.write(source, 0, 16, target.address + target.nbytes - 8, target.rkey)
    device.close()
    device2.close()


def test_a_write_waits_for_its_completion_without_the_gil():
    """While a write waits, the waiting thread runs no Python: the completion queue is read a few times only."""
    device, one, _, source, target = connected()
    with device.hold():
        waiter = threading.Thread(target=one.write, args=(source, 0, 4096, target.address, target.rkey))
        waiter.start()
        while device.ring.polls == 0:  # until the waiter polled once, found nothing and went to wait
            time.sleep(0.001)
        polls = device.ring.polls
        for _ in range(200):  # every one of these releases the GIL, to any thread that wants it
            time.sleep(0.0001)
        during = device.ring.polls - polls
    waiter.join()
    assert during < 20  # a Python loop of polls (as pyverbs needs) polls hundreds of times meanwhile
    device.close()
