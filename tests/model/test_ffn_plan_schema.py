"""The plan artifact's optional FFN keys: absent when nothing is cut (old plans read and
keep their bytes), validated when present."""

import json

import pytest

from headprune_cli.artifacts.schema import dumps, envelope, ffn_fields, parse_artifact
from headprune_cli.errors import ArtifactError


def _plan(**extra) -> dict:
    plan = envelope("plan", [], {})
    plan.update(
        strategy="global",
        constraints={},
        remove_heads={"0": [1]},
        remove_layers=[2],
        predicted={"before": {"params": 10, "flops_per_token": 20.0}, "after": {"params": 8, "flops_per_token": 16.0}},
        num_heads=[4, 4, 4],
        **extra,
    )
    return plan


def test_a_plan_without_ffn_cuts_has_no_ffn_keys():
    assert ffn_fields({0: [], 1: []}, [48, 48, 48]) == {}
    text = dumps(_plan(**ffn_fields({}, [48, 48, 48])))
    assert "ffn" not in text
    assert parse_artifact(text, "plan.json", ("plan",)).remove_ffn is None


def test_ffn_fields_round_trip_sorted():
    fields = ffn_fields({1: [7, 3, 40], 0: [0]}, [48, 48, 48])
    assert fields == {"remove_ffn": {"0": [0], "1": [3, 7, 40]}, "num_ffn": [48, 48, 48]}
    plan = parse_artifact(dumps(_plan(**fields)), "plan.json", ("plan",))
    assert plan.remove_ffn == {0: [0], 1: [3, 7, 40]} and plan.num_ffn == [48, 48, 48]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"remove_ffn": {"0": [1]}}, "remove_ffn needs num_ffn"),
        ({"remove_ffn": {"0": [3, 1]}, "num_ffn": [48] * 3}, "strictly increasing"),
        ({"remove_ffn": {"0": [1, 1]}, "num_ffn": [48] * 3}, "strictly increasing"),
        ({"remove_ffn": {"0": [48]}, "num_ffn": [48] * 3}, "out of range"),
        ({"remove_ffn": {"0": [-1]}, "num_ffn": [48] * 3}, "out of range"),
        ({"remove_ffn": {"5": [1]}, "num_ffn": [48] * 3}, "layer 5 out of range"),
        ({"remove_ffn": {"2": [1]}, "num_ffn": [48] * 3}, "also in remove_layers"),
        ({"remove_ffn": {"1": list(range(48))}, "num_ffn": [48] * 3}, "removes every neuron"),
        ({"remove_ffn": {"01": [1]}, "num_ffn": [48] * 3}, "plain digits"),
        ({"remove_ffn": {"0": [1]}, "num_ffn": [48] * 2}, "remove_ffn needs num_ffn"),
    ],
)
def test_bad_ffn_keys_are_refused(fields, message):
    with pytest.raises(ArtifactError, match=message):
        parse_artifact(json.dumps(_plan(**fields)), "plan.json", ("plan",))
