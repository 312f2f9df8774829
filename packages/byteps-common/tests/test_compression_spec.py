"""compression_params as BytePS takes them: parsed into one CompressionSpec, bad ones refused by name."""

from __future__ import annotations

import pytest

from byteps.common.compression import CompressionSpec, parse_compression_params, sparse_count


def test_the_bytesps_dicts_parse():
    assert parse_compression_params(None) is None and parse_compression_params({}) is None
    spec = parse_compression_params({"compressor": "OneBit", "scaling": "true", "ef": "vanilla",
                                     "momentum": "nesterov", "seed": 42}, momentum=0.9)
    assert spec == CompressionSpec("onebit", seed=42, scaling=True, ef=True, momentum=0.9)
    assert spec.wire() == {"compressor": "onebit", "k": None, "seed": 42, "scaling": True, "natural": False,
                           "l2": False, "ef": True}
    assert CompressionSpec.from_wire(spec.wire()) == CompressionSpec("onebit", seed=42, scaling=True, ef=True)
    dithering = parse_compression_params({"compressor": "dithering", "k": 4, "partition": "natural",
                                          "normalize": "l2"})
    assert (dithering.k, dithering.natural, dithering.l2, dithering.seed) == (4.0, True, True, None)
    assert parse_compression_params({"fp16": True}) == CompressionSpec("none", fp16=True)


@pytest.mark.parametrize("params, momentum, message", [
    ({"compressor": "twobit"}, None, r"'compressor'\] = 'twobit' is not one of"),
    ({"compressor": "onebit", "scale": True}, None, r"unknown key\(s\) \['scale'\]"),
    ({"compressor": "topk"}, None, r"'k'\] is required by the 'topk'"),
    ({"compressor": "topk", "k": 0}, None, r"'k'\] = 0.0 must be > 0"),
    ({"compressor": "randomk", "k": -2}, None, r"'k'\] = -2.0 must be > 0"),
    ({"compressor": "randomk", "k": "3"}, None, r"'k'\] must be a number"),
    ({"compressor": "onebit", "k": 3}, None, r"'k'\] does not apply to the 'onebit'"),
    ({"compressor": "dithering", "k": 2.5}, None, r"dithering needs a whole number of levels in 1..32768"),
    ({"compressor": "dithering", "k": 32, "partition": "natural"}, None, r"levels in 1..31 \(natural"),
    ({"compressor": "dithering", "k": 4, "partition": "log"}, None, r"'partition'\] = 'log' is not one of"),
    ({"compressor": "dithering", "k": 4, "normalize": "l1"}, None, r"'normalize'\] = 'l1' is not one of"),
    ({"compressor": "randomk", "k": 3, "seed": 0}, None, r"'seed'\] = 0 must be in 1..4294967295 \(BytePS refuses 0"),
    ({"compressor": "randomk", "k": 3, "seed": 2 ** 32}, None, r"'seed'\] = 4294967296 must be in"),
    ({"compressor": "onebit", "momentum": "nesterov"}, 0.0, r"optimizer's momentum, which is 0.0"),
    ({"compressor": "onebit", "momentum": "heavyball"}, 0.9, r"'momentum'\] = 'heavyball' is not one of"),
    ({"compressor": "onebit", "ef": "fancy"}, None, r"'ef'\] = 'fancy' is not one of \['vanilla'\]"),
    ({"ef": "vanilla"}, None, r"'ef' and 'momentum' need a 'compressor'"),
    ({"compressor": "onebit", "scaling": "yes"}, None, r"'scaling'\] must be True or False"),
])
def test_bad_params_name_the_parameter(params, momentum, message):
    with pytest.raises(ValueError, match=message):
        parse_compression_params(params, momentum)


def test_a_server_refuses_a_bad_spec_from_the_wire():
    with pytest.raises(ValueError, match="'seed'"):
        CompressionSpec.from_wire({"compressor": "randomk", "k": 2.0, "seed": 0})


@pytest.mark.parametrize("k, count, expected", [(3, 10, 3), (2.7, 10, 2), (0.1, 1000, 100), (0.001, 10, 1),
                                                 (50, 10, 10), (0.5, 1, 1)])
def test_k_is_a_count_or_a_fraction_per_partition(k, count, expected):
    assert sparse_count(k, count) == expected


def test_compression_of_an_integer_tensor_fails_at_the_call():
    import numpy as np

    from byteps.common.config import Config
    from byteps.common.options import PushPullOptions
    from byteps.common.worker import Worker

    worker = Worker(Config.from_env({}))
    try:
        spec = parse_compression_params({"compressor": "onebit"})
        with pytest.raises(ValueError, match="'onebit' takes float16, float32 or float64 tensors, not int32"):
            worker.push_pull_async(np.ones(10, np.int32), "counts", PushPullOptions(compression=spec))
        handle = worker.push_pull_async(np.ones(10, np.float32), "grads", PushPullOptions(compression=spec))
        assert handle.wait()[0] == 1
    finally:
        worker.shutdown()
