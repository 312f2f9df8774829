"""Keras ``backward_passes_per_step``: 2 workers x N passes match one process on the combined batch.

Runs scripts/keras_accumulation_checks.py under the real bpslaunch, on one
machine (``-np 2``) and with 2 workers and 1 server, and reads back the
largest difference each equivalence found (weights and optimizer state,
SGD with momentum and Adam, N = 1 and 2) from the single-process
reference, and the same after a save and load halfway.
"""

from __future__ import annotations

import re

import pytest
from tf_jobs import SCRIPTS, launch_tf_job

from byteps.testkit import assert_all_ok, rank_lines, report

LAYOUTS = {
    "one-machine-np2": ["-np", "2"],
    "two-workers-one-server": ["--workers", "2", "--servers", "1"],
}
#: Two optimizers, each: N = 1 through fit; N = 2 averaged through fit, tf.function and eager; N = 2 summed;
#: N = 2 saved halfway, loaded and resumed.
EQUIVALENCES = 2 * (1 + 3 + 1 + 1)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_passes_match_one_process_on_the_combined_batch(layout, tmp_path):
    result = launch_tf_job(LAYOUTS[layout], f"{SCRIPTS}/keras_accumulation_checks.py",
                           env={"BYTEPS_TEST_TMP": str(tmp_path)}, timeout=300)
    assert_all_ok(result, checks=EQUIVALENCES)
    for rank in range(2):
        reports = [line for line in rank_lines(result.stdout, rank) if line.startswith("equivalence")]
        assert len(reports) == EQUIVALENCES, report(result)
        for line in reports:
            difference = float(re.search(r"largest difference (\S+)$", line).group(1))
            assert difference < 1e-5, line
