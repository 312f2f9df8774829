"""The warning at the call when error feedback meets the optimizer's own momentum (docs/compression.md)."""

from __future__ import annotations

import warnings

import pytest

from byteps.common.compression import FeedbackMomentumWarning, parse_compression_params, warn_if_feedback_meets_momentum

DIVERGING = [
    {"compressor": "onebit", "scaling": True, "ef": "vanilla"},
    {"compressor": "randomk", "k": 0.1, "ef": "Vanilla"},
]
SAFE = [
    ({"compressor": "onebit", "scaling": True, "ef": "vanilla", "momentum": "nesterov"}, 0.9),  # in the compressor
    ({"compressor": "onebit", "scaling": True}, 0.9),  # no error feedback
    ({"compressor": "randomk", "k": 0.1, "ef": "vanilla"}, 0.0),  # no optimizer momentum
    ({"compressor": "randomk", "k": 0.1, "ef": "vanilla"}, None),
    ({"fp16": True}, 0.9),  # no compressor
    (None, 0.9),
]


@pytest.mark.parametrize("params", DIVERGING)
@pytest.mark.parametrize("parsed", [False, True])
def test_feedback_with_the_optimizers_momentum_warns_at_the_callers_line(params, parsed):
    given = parse_compression_params(params) if parsed else params
    with pytest.warns(FeedbackMomentumWarning) as caught:
        assert warn_if_feedback_meets_momentum(given, 0.9)
    (warning,) = caught
    text = str(warning.message)
    assert '"momentum": "nesterov"' in text and "BYTEPS_MIN_COMPRESS_BYTES" in text
    assert params["compressor"] in text and "0.9" in text
    assert warning.filename == __file__  # the user's line, not byteps'


def _spec_or_dict(params, parsed):
    if not parsed or params is None:
        return params
    mu = 0.9 if params.get("momentum") == "nesterov" else None
    return parse_compression_params(params, mu)


@pytest.mark.parametrize("params, momentum", SAFE)
@pytest.mark.parametrize("parsed", [False, True])
def test_safe_combinations_say_nothing(params, momentum, parsed):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not warn_if_feedback_meets_momentum(_spec_or_dict(params, parsed), momentum)
