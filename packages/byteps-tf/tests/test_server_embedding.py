"""ServerEmbedding (Keras layer) under the real launcher: a table held by the servers, trained beside a dense
layer through DistributedGradientTape against a numpy reference of SGD and Adagrad on every rank's batches
(scripts/server_embedding_checks.py; docs/sparse.md, "Tables held by the servers")."""

import pytest
from tf_jobs import SCRIPTS, launch_tf_job

from byteps.testkit import assert_all_ok, tail

SCRIPT = f"{SCRIPTS}/server_embedding_checks.py"
CHECKS = ["sgd", "adagrad", "sgd_in_function", "keras_fit", "eval_on_one_rank", "save_and_load", "bad_ids"]
LAYOUTS = {
    "two-workers-two-servers": ["--workers", "2", "--servers", "2"],
    "two-machines-of-two": ["-np", "2", "--workers", "2", "--servers", "1"],  # the machine's rows summed first
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_server_embedding_trains_as_the_reference(layout, tmp_path):
    args = LAYOUTS[layout]
    assert_all_ok(launch_tf_job(args, SCRIPT, [str(tmp_path)]), len(CHECKS), 4 if "-np" in args else 2)


def test_a_server_embedding_without_servers_says_what_to_add(tmp_path):
    result = launch_tf_job(["-np", "2"], SCRIPT, [str(tmp_path)], timeout=120)
    assert result.returncode != 0
    assert "needs servers (bpslaunch --servers N" in result.stdout + result.stderr, tail(result.stdout)


def test_keras_2_server_embedding_trains_as_the_reference(tmp_path):
    # TF_USE_LEGACY_KERAS=1: the layer is a Keras 2 (tf_keras) layer, fit runs Keras 2's DistributedOptimizer.
    result = launch_tf_job(["--workers", "2", "--servers", "1"], SCRIPT, [str(tmp_path)],
                           env={"TF_USE_LEGACY_KERAS": "1"})
    assert_all_ok(result, len(CHECKS))


def test_the_layer_holds_no_variable_and_checks_its_arguments():
    import numpy as np
    import tensorflow as tf

    import byteps.tensorflow as bps
    import byteps.tensorflow.keras as kbps

    assert kbps.ServerEmbedding is bps.ServerEmbedding and "ServerEmbedding" in bps.__all__
    emb = bps.ServerEmbedding(100, 4, name="user/ids", optimizer="adagrad", lr=0.05, seed=3)
    assert emb.table_name == "user/ids" and emb.name == "user_ids"
    assert not emb.weights and not emb.trainable_variables
    assert emb.compute_output_shape((None, 5)) == (None, 5, 4)
    again = bps.ServerEmbedding.from_config(emb.get_config())
    assert (again.table_name, again.num_embeddings, again.embedding_dim, again.held) == \
        (emb.table_name, emb.num_embeddings, emb.embedding_dim, emb.held)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="num_embeddings must be a positive int"):
            bps.ServerEmbedding(bad, 4, name="t")
    with pytest.raises(ValueError, match="non-empty name"):
        bps.ServerEmbedding(10, 4, name="")
    for ids in (tf.constant([0.0]), np.array([1.5]), tf.constant(["a"]), [0.5]):
        with pytest.raises(ValueError, match=r"ServerEmbedding\('user/ids'\): ids must be an int64 or int32"):
            emb.lookup(ids)
