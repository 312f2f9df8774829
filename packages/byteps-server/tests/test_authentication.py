"""The job secret: a stranger on the same machine cannot join, register or push into a running job."""

import json
import os
import re
import sys
import time

import zmq

from byteps.testkit import start_job
from byteps.transport import AuthenticationError, Command, Connection, authenticate
from byteps.transport.frames import decode_header, encode_header

WORKER = [sys.executable, "-m", "byteps.testkit.push_pull_worker"]
SECRET = {"BYTEPS_JOB_SECRET": "s3cret-of-this-job", "BYTEPS_LOG_LEVEL": "INFO"}
SPEC = {"rounds": 150, "tensors": [{"name": "w", "dtype": "float32", "count": 1000, "average": False},
                                   {"name": "b", "dtype": "int64", "count": 10, "average": True}]}


def wait_for(job, name, pattern, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, job.output(name))
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{name} never printed {pattern!r}:\n{job.output(name)[-2000:]}")


def ask(context, address, frames):
    """Send raw frames from a fresh connection; return the decoded answer (command, text)."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    for message in frames:
        sock.send_multipart(message)
    assert sock.poll(5000), "no answer"
    reply = sock.recv_multipart()
    sock.close()
    return decode_header(reply[0], 1 << 20).command, (reply[1].decode() if len(reply) > 1 else "")


def test_strangers_are_refused_and_the_job_stays_correct():
    job = start_job(WORKER + [json.dumps(SPEC)], 2, 1, env=SECRET, timeout=120)
    context = zmq.Context()
    try:
        server = "tcp://" + wait_for(job, "server0", r"server 0 at tcp://([0-9.]+:\d+)").group(1)
        scheduler = f"tcp://127.0.0.1:{job.port}"
        # 1. no handshake at all: a push into the healthy tensor's key
        init = json.dumps({"name": "w", "partition": 0, "shape": [1000], "tensor_nbytes": 4000,
                           "nbytes": 4000, "dtype": 0}).encode()
        command, text = ask(context, server, [[encode_header(Command.INIT_KEY, 0, 0, 0, len(init)), init],
                                              [encode_header(Command.PUSH, 0, 0, 0, 4000), bytes(4000)]])
        assert command == Command.ERROR and "not authenticated" in text
        # 2. a handshake with a made-up proof
        hello = os.urandom(16)
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(server)
        sock.send_multipart([encode_header(Command.HELLO, 0, payload_bytes=16), hello])
        assert sock.poll(5000) and decode_header(sock.recv_multipart()[0], 1 << 20).command == Command.CHALLENGE
        sock.send_multipart([encode_header(Command.PROOF, 0, payload_bytes=32), bytes(32)])
        assert sock.poll(5000)
        reply = sock.recv_multipart()
        assert decode_header(reply[0], 1 << 20).command == Command.ERROR and b"wrong proof" in reply[1]
        sock.close()
        # 3. the wrong secret: the stranger cannot even trust the server
        connection = Connection(context, *server[6:].split(":"))
        try:
            authenticate(connection, b"guess", 0, timeout_s=5)
            raise AssertionError("a wrong secret was accepted")
        except AuthenticationError as exc:
            assert "does not know this job's secret" in str(exc)
        finally:
            connection.close(0)
        # 4. registering with the scheduler without the secret
        register = json.dumps({"role": "worker", "worker_id": 0}).encode()
        command, text = ask(context, scheduler, [[encode_header(Command.REGISTER, -1, payload_bytes=len(register)),
                                                  register]])
        assert command == Command.ERROR and "not authenticated" in text
        assert job.wait(120)
    finally:
        context.term()
        result = job.finish()
    assert all(code == 0 for code in result.codes.values()), result.failures()
    for rank in (0, 1):
        assert f"rank {rank} of 2: 150 rounds of 2 tensors OK" in result.outputs[f"worker{rank}"]
    assert result.outputs["server0"].count("refused a peer") >= 2
    assert "refused a peer" in result.outputs["scheduler"]


def test_a_worker_with_another_secret_cannot_join():
    job = start_job(WORKER + [json.dumps(SPEC)], 2, 1, env={**SECRET, "BYTEPS_RENDEZVOUS_TIMEOUT": "5"},
                    overrides={"worker1": {"BYTEPS_JOB_SECRET": "not-this-job"}}, timeout=60)
    try:
        job.wait(30)
    finally:
        result = job.finish()
    out = result.outputs["worker1"]
    assert result.codes["worker1"] not in (0, None), out
    assert "does not know this job's secret (BYTEPS_JOB_SECRET differs)" in out, out
