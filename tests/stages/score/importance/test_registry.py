"""The registry's declarations match the classes: every method is an Importance, and it
scores exactly the units its entry says (heads, FFN neurons, layers)."""

from __future__ import annotations

import pytest

from headprune_cli.stages.score.importance import HEAD_METHODS, LAYER_METHODS, Importance, make_scorer
from headprune_cli.stages.score.importance.registry import YES


def _overrides(cls, unit: str) -> bool:
    return getattr(cls, unit) is not getattr(Importance, unit)


@pytest.mark.parametrize("name", sorted(HEAD_METHODS))
def test_head_methods_score_heads_and_neurons_as_declared(name):
    entry = HEAD_METHODS[name]
    scorer = make_scorer(name)
    assert isinstance(scorer, Importance) and scorer.name == name
    assert _overrides(type(scorer), "heads")
    assert _overrides(type(scorer), "neurons") == (entry.ffn == YES)
    assert not _overrides(type(scorer), "layers")


@pytest.mark.parametrize("name", sorted(LAYER_METHODS))
def test_layer_methods_score_layers_only(name):
    scorer = LAYER_METHODS[name].make()
    assert isinstance(scorer, Importance) and scorer.name == name
    assert _overrides(type(scorer), "layers")
    assert not _overrides(type(scorer), "heads") and not _overrides(type(scorer), "neurons")


def test_a_scorer_gets_only_the_options_its_entry_names():
    assert make_scorer("gradient", normalize=False, weights={"taylor": 1.0}).settings() == {"normalize": False}
    assert make_scorer("taylor", normalize=False, weights={"taylor": 1.0}).settings() == {}
    assert make_scorer("combined", weights={"fisher": 2.0, "taylor": 1.0}).settings() == {
        "weights": {"fisher": 2.0, "taylor": 1.0}
    }


def test_gradient_refuses_normalised_neuron_scores_before_any_pass():
    from headprune_cli.errors import UsageError

    make_scorer("gradient", normalize=False).check(ffn=True)
    make_scorer("gradient").check(ffn=False)
    with pytest.raises(UsageError, match="--no-normalize"):
        make_scorer("gradient").check(ffn=True)
