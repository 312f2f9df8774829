"""Local ranks talk only to processes that know the job secret.

Abstract Unix sockets can be reached by any process on the host; without
authentication a forged LOCAL_DONE would make a rank copy out a buffer the
root has not summed yet.
"""

import os
import sys
import time
import uuid

import zmq

from byteps.testkit import start_job
from byteps.transport import Command
from byteps.transport.frames import decode_header, encode_header

HERE = os.path.dirname(__file__)
WORKER = [sys.executable, os.path.join(HERE, "local_stranger_worker.py")]


def test_a_stranger_cannot_forge_a_local_done(tmp_path):
    job_id = "stranger" + uuid.uuid4().hex[:8]
    done_file = tmp_path / "stranger-done"
    env = {"BYTEPS_JOB_SECRET": "the-job-secret", "BYTEPS_JOB_ID": job_id,
           "STRANGER_DONE_FILE": str(done_file), "PS_VERBOSE": "1"}
    job = start_job(WORKER, 1, 0, local_size=2, env=env, timeout=30)
    context = zmq.Context()
    stranger = context.socket(zmq.DEALER)
    stranger.setsockopt(zmq.LINGER, 0)
    try:
        # Rank 1's inbox; wait until rank 1 has written its input and waits for the root.
        stranger.connect(f"ipc://@byteps-{job_id}-m0-l1")
        time.sleep(3)
        # tensor 0, partition 0, round 0; aux = partition bytes (1000 float32)
        stranger.send(encode_header(Command.LOCAL_DONE, 0, 0, 0, 0, 0, 0, 4000))
        assert stranger.poll(10_000), "the stranger's message was neither answered nor refused"
        reply = decode_header(stranger.recv(), 1 << 20)
        assert reply.command == Command.ERROR
        text = stranger.recv().decode()
        assert "not authenticated" in text and "BYTEPS_JOB_SECRET" in text
        done_file.write_text("sent")
        assert job.wait(60), "job timed out"
    finally:
        done_file.write_text("sent")
        stranger.close(0)
        context.term()
        result = job.finish()
    assert all(code == 0 for code in result.codes.values()), result.failures()
    for rank in (0, 1):
        assert f"rank {rank} result min 3 max 3" in result.outputs[f"worker{rank}"], result.failures()
    assert "refused a peer" in result.outputs["worker1"]
