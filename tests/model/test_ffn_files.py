"""FFN cuts in files: the streamed prune (no model built) writes the bytes of the in-memory
cut + save on every family; the layout key appears only when an FFN was cut; a stored
FFN layout that disagrees with the config or is malformed is refused."""

import hashlib
import json

import pytest
import torch

from headprune_cli import load, save
from headprune_cli.errors import CheckpointError
from headprune_cli.model import checkpoint
from headprune_cli.model.layout import Layout, from_ranges, info_of, to_ranges
from headprune_cli.model.streaming import prune_file
from headprune_cli.model.surgery import apply_plan
from tests.support import ROOT, TINY, ffn_plan, model_inputs, model_output
from tests.support import gqa_plan as _plan


@pytest.mark.parametrize("name", sorted(TINY))
def test_streamed_ffn_prune_writes_the_bytes_of_the_in_memory_path(name, tmp_path, monkeypatch):
    save(TINY[name](), tmp_path / "m.safetensors")
    model = load(tmp_path / "m.safetensors")
    heads, layers = _plan(model)
    neurons = {0: ffn_plan(name)[0], 2: ffn_plan(name)[2]}
    save(apply_plan(model, heads, layers, neurons), tmp_path / "memory.safetensors", plan_sha="ab" * 32)

    def no_model(*args):
        raise AssertionError("the streamed path must not materialise the model")

    monkeypatch.setattr(checkpoint, "fill", no_model)
    digest = prune_file(
        tmp_path / "m.safetensors",
        tmp_path / "streamed.safetensors",
        heads,
        layers,
        plan_sha="ab" * 32,
        remove_ffn=neurons,
    )
    written = (tmp_path / "streamed.safetensors").read_bytes()
    assert written == (tmp_path / "memory.safetensors").read_bytes()
    assert digest == hashlib.sha256(written).hexdigest()
    monkeypatch.undo()
    assert torch.equal(
        model_output(load(tmp_path / "streamed.safetensors"), model_inputs(name)),
        model_output(model, model_inputs(name)),
    )


def test_streamed_prune_of_an_ffn_pruned_file_cuts_again_in_original_indices(tmp_path):
    save(TINY["gpt2"](), tmp_path / "m.safetensors")
    prune_file(tmp_path / "m.safetensors", tmp_path / "a.safetensors", {}, [], remove_ffn={1: [0, 5, 9]})
    prune_file(tmp_path / "a.safetensors", tmp_path / "b.safetensors", {}, [], remove_ffn={1: [6], 2: [127]})
    expected = apply_plan(load(tmp_path / "m.safetensors"), {}, [], {1: [0, 5, 6, 9], 2: [127]})
    again = load(tmp_path / "b.safetensors")
    assert info_of(again).layout.ffn == info_of(expected).layout.ffn
    assert torch.equal(model_output(again, model_inputs("gpt2")), model_output(expected, model_inputs("gpt2")))


def _layout_meta(path) -> dict:
    return json.loads(checkpoint.read_metadata(path)["layout"])


def test_layout_stores_ffn_as_runs_only_when_cut(tmp_path):
    model = TINY["llama"]()
    save(model, tmp_path / "full.safetensors")
    assert "ffn" not in _layout_meta(tmp_path / "full.safetensors")
    apply_plan(model, {0: [1]}, [], {2: [0, 1, 2, 10, 47]})
    assert "ffn" not in json.loads(json.dumps(Layout.to_dict(_heads_only(model))))
    save(model, tmp_path / "cut.safetensors")
    assert _layout_meta(tmp_path / "cut.safetensors")["ffn"] == {
        "width": [48, 48, 48],
        "kept": {"2": [[3, 10], [11, 47]]},
    }


def _heads_only(model):
    layout = info_of(model).layout
    return Layout(layout.num_heads, layout.num_kv_heads, layout.layers, layout.heads, layout.kv_heads, layout.num_ffn)


def test_ranges_round_trip_and_refuse_non_canonical_runs():
    for indices in ([], [0], [0, 1, 2], [1, 3, 4, 9], list(range(0, 100, 2))):
        assert from_ranges(to_ranges(indices), 100) == indices
    for runs in (
        [[0, 0]],
        [[2, 1]],
        [[0, 2], [2, 3]],
        [[3, 4], [0, 1]],
        [[0, 101]],
        [[-1, 2]],
        [[0, 1.0]],
        [[0, True]],
        "0-3",
        [[0, 1, 2]],
    ):
        assert from_ranges(runs, 100) is None, runs


def _rewrite_layout(path, out, change):
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as handle:
        # safe_open has keys() but no __iter__
        meta, tensors = handle.metadata(), {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
    layout = json.loads(meta["headprune.layout"])
    change(layout)
    save_file(tensors, str(out), {**meta, "headprune.layout": json.dumps(layout)})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d["ffn"].update(width=[40, 48, 48]),
            r"FFN widths \[40, 48, 48\] differ from the config's \[48, 48, 48\]",
        ),
        (lambda d: d["ffn"]["kept"].update({"2": [[0, 60]]}), "malformed FFN layout"),
        (lambda d: d["ffn"]["kept"].update({"2": [[0, 48]]}), r"FFN neurons of layer 2 out of range, or none cut"),
        (lambda d: d["ffn"]["kept"].update({"1": [[0, 3]]}), r"FFN neurons listed for layer 1, which it does not keep"),
        (lambda d: d["ffn"]["kept"].update({"02": [[0, 3]]}), "malformed FFN layout"),
        (lambda d: d["ffn"].update(width=[1 << 22] * 3), "malformed FFN layout"),
        (lambda d: d.update(ffn=[1, 2]), "malformed FFN layout"),
    ],
)
def test_a_bad_stored_ffn_layout_is_refused(tmp_path, change, message):
    model = apply_plan(TINY["llama"](), {}, [1], {2: [0, 1]})
    save(model, tmp_path / "m.safetensors")
    _rewrite_layout(tmp_path / "m.safetensors", tmp_path / "bad.safetensors", change)
    with pytest.raises(CheckpointError, match=message):
        load(tmp_path / "bad.safetensors")


def test_stored_widths_that_do_not_match_the_tensors_are_refused(tmp_path):
    model = apply_plan(TINY["llama"](), {}, [], {2: [0, 1]})
    save(model, tmp_path / "m.safetensors")
    _rewrite_layout(
        tmp_path / "m.safetensors", tmp_path / "bad.safetensors", lambda d: d["ffn"]["kept"].update({"2": [[0, 47]]})
    )
    with pytest.raises(
        CheckpointError,
        match=r"'model.layers.2.mlp.down_proj.weight' has shape \[32, 46\], the layout needs \[32, 47\]",
    ):
        load(tmp_path / "bad.safetensors")


def test_a_checkpoint_from_before_ffn_pruning_reads_as_full_widths(tmp_path):
    demo = ROOT / "examples" / "demo" / "model.safetensors"
    model = load(demo)
    layout = info_of(model).layout
    assert layout.ffn == {} and layout.num_ffn and all(w == layout.ffn_width(i) for i, w in enumerate(layout.num_ffn))
    save(model, tmp_path / "again.safetensors")
    assert (
        checkpoint.read_metadata(tmp_path / "again.safetensors")["layout"] == checkpoint.read_metadata(demo)["layout"]
    )


def test_the_command_line_refuses_a_bad_ffn_layout_in_one_line(tmp_path, cli):
    from tests.support import assert_refused

    save(apply_plan(TINY["bert"](), {}, [], {0: [1]}), tmp_path / "m.safetensors")
    _rewrite_layout(
        tmp_path / "m.safetensors", tmp_path / "bad.safetensors", lambda d: d["ffn"]["kept"].update({"0": [[5, 2]]})
    )
    assert_refused(cli("inspect", tmp_path / "bad.safetensors"), 1, "malformed FFN layout")
