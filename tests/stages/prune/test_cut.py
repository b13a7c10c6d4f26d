"""prune/cut.py: `cut` and `prune_once`, the in-memory score -> select -> cut every stage shares."""

from __future__ import annotations

import copy

import pytest
import torch

from headprune_cli import load, save
from headprune_cli.model.checkpoint import read_layout_only
from headprune_cli.model.layout import info_of
from headprune_cli.model.streaming import prune_layout
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.prune.cut import Compensation, choose, cut, prune_once, refit
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.select.chains import Selection
from headprune_cli.stages.select.strategies import select
from tests.support import TINY, calibration, model_inputs, model_output
from tests.support.resident import linux_only, resident_kib


def _table(model) -> ScoreTable:
    layout = info_of(model).layout
    heads = {
        layer: {head: float((7 * layer + 3 * head) % 11) for head in kept}
        for layer, kept in zip(layout.layers, layout.heads)
    }
    return ScoreTable(heads=heads, num_heads=list(layout.num_heads), num_kv_heads=list(layout.num_kv_heads))


def test_prune_once_is_select_then_cut_on_a_copy():
    model = TINY["bert"]()
    before = copy.deepcopy(model.state_dict())
    table = _table(model)
    pruned = prune_once(model, Budget("heads", 0.5), table, Constraints(min_heads=1))

    expected = select(table, "global", budget=Budget("heads", 0.5), constraints=Constraints(min_heads=1))
    assert pruned.selection.remove_heads == expected.remove_heads
    assert pruned.heads_removed == sum(len(h) for h in expected.remove_heads.values()) > 0
    by_hand = copy.deepcopy(model)
    cut(by_hand, expected)
    inputs = model_inputs("bert")
    assert torch.equal(model_output(pruned.model, inputs), model_output(by_hand, inputs))
    # The input model is not touched.
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert sum(len(h) for h in info_of(model).layout.heads) == sum(info_of(model).layout.num_heads)


def test_prune_once_compensates_as_cut_does():
    model = TINY["bert"]()
    table = _table(model)
    compensation = Compensation("bias", calibration(2, seed=0))
    pruned = prune_once(model, Budget("heads", 0.5), table, compensation=compensation)
    assert pruned.compensation is not None and pruned.compensation.method == "bias"
    by_hand = copy.deepcopy(model)
    cut(by_hand, pruned.selection, compensation)
    inputs = model_inputs("bert")
    assert torch.equal(model_output(pruned.model, inputs), model_output(by_hand, inputs))


def test_choose_picks_the_strategy_from_the_budget():
    model = TINY["bert"]()
    table = _table(model)
    assert choose(model, Budget("heads", 0.25), table).strategy == "global"
    assert choose(model, Budget("heads", 0.25), table, strategy="layer").strategy == "layer"


def _cut_by_hand(folder, family: str) -> Selection:
    """A tiny `family` model at folder/m.safetensors, and folder/cut.safetensors: that model
    cut (heads, a layer, FFN neurons) with lstsq compensation and saved, the reference bytes."""
    save(TINY[family](), folder / "m.safetensors")
    layout = info_of(load(folder / "m.safetensors")).layout
    width = len(layout.kept_neurons(layout.layers[0]))
    selection = Selection(
        "hand",
        {layout.layers[0]: [1], layout.layers[-1]: [0, 2]},
        [layout.layers[1]],
        remove_ffn={layout.layers[0]: list(range(0, width, 3)), layout.layers[-1]: [1, 4]},
    )
    by_cut = load(folder / "m.safetensors")
    cut(by_cut, selection, Compensation("lstsq", calibration(3, seed=5)))
    save(by_cut, folder / "cut.safetensors", plan_sha="0" * 64)
    return selection


def _write_sliced(folder, selection: Selection, tensors: dict) -> bytes:
    """folder/m.safetensors cut by `selection` while written, `tensors` taken from memory."""
    prune_layout(
        read_layout_only(folder / "m.safetensors", hashed=True),
        folder / "m.safetensors",
        folder / "sliced.safetensors",
        selection.remove_heads,
        selection.remove_layers,
        plan_sha="0" * 64,
        remove_ffn=selection.remove_ffn,
        tensors=tensors,
    )
    return (folder / "sliced.safetensors").read_bytes()


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_refit_then_a_sliced_write_gives_the_bytes_of_cut_then_save(tmp_path, family):
    """`prune --data`'s route (refit in memory, slice while writing) against cut + save."""
    selection = _cut_by_hand(tmp_path, family)
    model = load(tmp_path / "m.safetensors")
    assert refit(model, selection, Compensation("lstsq", calibration(3, seed=5))) is not None
    sliced = _write_sliced(tmp_path, selection, model.state_dict(keep_vars=True))
    assert sliced == (tmp_path / "cut.safetensors").read_bytes()


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_the_streamed_refit_gives_the_bytes_of_cut_then_save_holding_only_the_refit(tmp_path, family):
    """`prune --data` as it runs now: loaded tensor by tensor, each block given back to the
    file once compensation passed it, only the rewritten projections sliced from memory."""
    selection = _cut_by_hand(tmp_path, family)
    model = load(tmp_path / "m.safetensors", per_tensor=True)
    result = refit(model, selection, Compensation("lstsq", calibration(3, seed=5), release=True))
    assert result is not None and result.rewritten
    state = model.state_dict(keep_vars=True)
    sliced = _write_sliced(tmp_path, selection, {name: state[name] for name in result.rewritten})
    assert sliced == (tmp_path / "cut.safetensors").read_bytes()


@linux_only
def test_the_streamed_refit_leaves_no_block_resident_but_the_refit_projections(tmp_path):
    save(TINY["llama"](), tmp_path / "m.safetensors")
    model = load(tmp_path / "m.safetensors", per_tensor=True)
    selection = Selection("hand", {0: [1], 2: [0]}, [], remove_ffn={1: [0, 3, 5]})
    result = refit(model, selection, Compensation("lstsq", calibration(3, seed=5), release=True))
    assert result is not None
    assert sorted(result.rewritten) == [
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.layers.2.self_attn.o_proj.weight",
    ]
    state = model.state_dict(keep_vars=True)
    blocks = {n: t for n, t in state.items() if n.startswith("model.layers.") and int(n.split(".")[2]) <= 2}
    held = {n for n, t in blocks.items() if resident_kib(t) > 0}
    assert held <= set(result.rewritten)
    assert all(resident_kib(state[n]) > 0 for n in result.rewritten)  # written in place: held, not released
