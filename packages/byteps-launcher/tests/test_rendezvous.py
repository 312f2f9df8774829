"""bpslaunch's rendezvous service and the worker's ServiceBoard, over a real socket on 127.0.0.1.

The service serves the epoch folder bpslaunch writes; a worker on another
host reads it through the board. The tests write epochs as bpslaunch does
and read them as a worker does: the secret never crosses the socket, yet
the worker derives the same one; anything signed with another key is
refused on both sides.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from byteps.common.elastic.membership import (
    SIGNATURE_HEADER,
    Epoch,
    RendezvousError,
    ServiceBoard,
    board_from_env,
    epoch_ended,
    epoch_secret,
    leaving_members,
    update_pending,
    wait_for_epoch,
    write_epoch,
)
from byteps.launcher.ports import free_port
from byteps.launcher.rendezvous import RendezvousService

KEY = "k" * 64


def epoch(number, members=("w0", "w1"), pending=False):
    job_id = f"job{number}"
    return Epoch(number=number, members=tuple(members), root_port=40000 + number, num_server=1, job_id=job_id,
                 secret=epoch_secret(KEY, job_id), root_uri="127.0.0.1", pending=pending)


@pytest.fixture
def service(tmp_path):
    running = RendezvousService(str(tmp_path), KEY, "127.0.0.1")
    running.start()
    yield running
    running.close()


def test_a_worker_reads_the_epoch_and_derives_its_secret_which_is_never_sent(service, tmp_path):
    board = ServiceBoard(service.address, KEY)
    assert board.read() is None  # before the first epoch
    published = epoch(3, ("w0", "w2"))
    write_epoch(tmp_path, published)
    assert board.read() == published
    with urllib.request.urlopen(f"http://{service.address}/epoch", timeout=5) as answer:
        body = answer.read()
    assert "secret" not in json.loads(body) and published.secret.encode() not in body


def test_a_worker_with_another_key_refuses_the_answer(service, tmp_path):
    write_epoch(tmp_path, epoch(0))
    with pytest.raises(RendezvousError, match="wrong signature.*BYTEPS_ELASTIC_KEY"):
        ServiceBoard(service.address, "another key").read()
    with pytest.raises(RendezvousError, match="wrong signature"):  # waiting does not paper over it either
        wait_for_epoch(ServiceBoard(service.address, "another key"), "w0", -1)


def test_leaving_is_announced_signed_and_a_forged_announcement_changes_nothing(service, tmp_path):
    write_epoch(tmp_path, epoch(1))
    ServiceBoard(service.address, KEY).announce_leaving("w1", 1)
    assert leaving_members(tmp_path, 1) == {"w1"}
    with pytest.raises(RendezvousError, match="refused w0 leaving epoch 1 \\(403"):
        ServiceBoard(service.address, "another key").announce_leaving("w0", 1)
    forged = urllib.request.Request(f"http://{service.address}/leaving/1/w0", data=b"leaving 1 w0", method="POST",
                                    headers={SIGNATURE_HEADER: "00" * 32})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(forged, timeout=5)
    assert refused.value.code == 403
    for path in ("/leaving/1/../../etc", "/leaving/x/w0", "/other"):
        request = urllib.request.Request(f"http://{service.address}{path}", data=b"", method="POST")
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(request, timeout=5)
        assert bad.value.code == 400, path
    assert leaving_members(tmp_path, 1) == {"w1"}


def test_a_waiting_worker_is_let_in_when_an_epoch_names_it(service, tmp_path):
    write_epoch(tmp_path, epoch(0, ("w0", "w1")))
    board = ServiceBoard(service.address, KEY)
    threading.Timer(0.3, write_epoch, (tmp_path, epoch(1, ("w0", "w1", "w2")))).start()
    started = time.monotonic()
    joined = wait_for_epoch(board, "w2", after=0)
    assert joined.number == 1 and joined.rank_of("w2") == 2 and time.monotonic() - started < 5
    assert epoch_ended(board, 1) is None and not update_pending(board, 1)
    write_epoch(tmp_path, epoch(1, ("w0", "w1", "w2"), pending=True))
    assert update_pending(board, 1)
    write_epoch(tmp_path, epoch(2, ("w0",)))
    assert "epoch 2 is current" in epoch_ended(board, 1)


def test_a_service_that_is_gone_is_not_taken_for_an_ended_epoch():
    board = ServiceBoard(f"127.0.0.1:{free_port('127.0.0.1')}", KEY)
    started = time.monotonic()
    assert epoch_ended(board, 0) is None  # the comm thread asks once a second: no verdict, no long block
    assert time.monotonic() - started < 3
    with pytest.raises(RendezvousError, match="does not answer"):
        board.read()


@pytest.mark.parametrize("environ, message", [
    ({"BYTEPS_ELASTIC_RENDEZVOUS": "127.0.0.1:1"}, "BYTEPS_ELASTIC_RENDEZVOUS is set but BYTEPS_ELASTIC_WORKER"),
    ({"BYTEPS_ELASTIC_RENDEZVOUS": "127.0.0.1:1", "BYTEPS_ELASTIC_WORKER": "w0"},
     "BYTEPS_ELASTIC_RENDEZVOUS is set but BYTEPS_ELASTIC_KEY is not"),
    ({"BYTEPS_ELASTIC_DIR": "/tmp/x"}, "BYTEPS_ELASTIC_DIR is set but BYTEPS_ELASTIC_WORKER"),
])
def test_a_half_given_elastic_environment_names_what_is_missing(environ, message):
    with pytest.raises(ValueError, match=message):
        board_from_env(environ)
    assert board_from_env({}) is None
