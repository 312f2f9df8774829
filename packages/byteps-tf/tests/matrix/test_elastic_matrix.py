"""Elastic training where the default run has no test (docs/horovod-compatibility.md, note 14): a worker lost
during an *eager* collective (the custom loop's gradients computed eagerly: the loss reaches the loop as
``JobLostError``), Keras 2's ``fit`` (TF_USE_LEGACY_KERAS=1) with ``KerasState`` and the elastic callbacks, and
Keras 3's ``fit`` with them and the custom loop in asynchronous jobs (kept out of the default run for CI time).
The jobs and checks are tests/test_elastic.py's: the custom loop ends on the value computed for the job sizes it
went through; fit finishes after the survivors rejoin.
"""

from __future__ import annotations

import re

from test_elastic import custom_loop_survives_a_lost_worker, keras_fit_survives_a_lost_worker


def test_an_eager_custom_loop_survives_a_worker_lost_in_an_eager_collective():
    output = custom_loop_survives_a_lost_worker("tape-eager")
    # The lost job came out of the eager DistributedGradientTape.gradient(), as byteps' JobLostError.
    assert re.search(r"^\[worker [01]\] lost in gradient: JobLostError JobLost True$", output, re.M), output[-6000:]


def test_keras_2_fit_with_the_elastic_callbacks_survives_a_lost_worker():
    output = keras_fit_survives_a_lost_worker(extra_env={"TF_USE_LEGACY_KERAS": "1"})
    assert re.search(r"^\[worker 0\] keras from tf_keras$", output, re.M), output[-6000:]


def test_keras_fit_with_the_elastic_callbacks_survives_a_lost_worker_asynchronously():
    # Every epoch needs two workers (--min-np 2); each commit takes the servers' weights.
    keras_fit_survives_a_lost_worker(asynchronous=True)


def test_a_custom_loop_survives_a_lost_worker_asynchronously():
    # docs/elastic.md, "Asynchronous training": no average, every rank's own update lands once on the servers'
    # variable; the commit pushes the tape's last update and takes the store.
    custom_loop_survives_a_lost_worker("tape", asynchronous=True)
