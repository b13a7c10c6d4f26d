"""FFN neurons from `score --ffn` to `select` and `prune`: scores that are the mask
gradients they claim to be, compact artifacts that read back, and one budget over heads,
neurons and layers that predicts the cut model's cost exactly."""

from __future__ import annotations

import json

import pytest
import torch

from headprune_cli import save
from headprune_cli.artifacts.schema import read_artifact
from headprune_cli.data.readers import read_data
from headprune_cli.model.cost import flops_per_token
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import NeuronGates, apply_plan
from headprune_cli.stages.budget import Budget
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.score.importance import score_model
from headprune_cli.stages.score.importance.context import ScoreContext
from headprune_cli.stages.score.importance.gradients import batch_losses
from headprune_cli.stages.score.table import ScoreTable
from headprune_cli.stages.select.strategies import select
from tests.support import TINY, assert_refused, give_tokenizer, write_jsonl, write_text

FAMILIES = [("reference", "jsonl"), ("bert", "jsonl"), ("gpt2", "text"), ("llama-gqa", "text"), ("distilbert", "jsonl")]


def _setup(tmp_path, name: str, kind: str, rows: int = 10):
    model = give_tokenizer(TINY[name](), encoder=kind == "jsonl")
    labels = 3 if name == "bert" else 2
    path = (
        write_jsonl(tmp_path / "d.jsonl", rows, num_labels=labels)
        if kind == "jsonl"
        else write_text(tmp_path / "d.txt", rows)
    )
    return model, read_data(path, model), path


@pytest.mark.parametrize(("name", "kind"), FAMILIES)
def test_neuron_fisher_and_gradient_are_the_per_example_mask_gradients(tmp_path, name, kind):
    model, data, _ = _setup(tmp_path, name, kind)
    model = model.double()
    result = score_model(model, data, "fisher", batch_size=4, ffn=True)
    plain = score_model(model, data, "gradient", batch_size=4, normalize=False, ffn=True)
    # The same quantities from explicit per-example neuron gates, one example at a time.
    ctx = ScoreContext(
        model, data, info_of(model).task if info_of(model).task != "embedding" else "fidelity", batch_size=1
    )
    ctx.objective = result.objective
    layout = info_of(model).layout
    widths = [layout.ffn_width(l) for l in layout.layers]
    sq = [torch.zeros(w, dtype=torch.float64) for w in widths]
    ab = [torch.zeros(w, dtype=torch.float64) for w in widths]
    for i in range(len(data)):
        batch = {
            k: v
            for k, v in {
                "input_ids": data.input_ids[i : i + 1],
                "attention_mask": data.attention_mask[i : i + 1],
                "labels": None if data.labels is None else data.labels[i : i + 1],
            }.items()
            if v is not None
        }
        gates = [torch.ones(w, dtype=torch.float64, requires_grad=True) for w in widths]
        with NeuronGates(model, gates):
            loss = batch_losses(ctx, batch, i).sum()
        for pos, g in enumerate(torch.autograd.grad(loss, gates)):
            sq[pos] += g * g
            ab[pos] += g.abs()
    for pos, layer in enumerate(layout.layers):
        assert result.ffn[layer] == pytest.approx(sq[pos].tolist(), rel=1e-6, abs=1e-15)
        assert plain.ffn[layer] == pytest.approx((ab[pos] / len(data)).tolist(), rel=1e-6, abs=1e-15)
    # Heads are untouched by --ffn.
    assert score_model(model, data, "fisher", batch_size=4).heads == result.heads


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_the_neuron_tap_sums_the_float64_products_of_its_inputs(tmp_path, dtype):
    """16-bit inputs are multiplied in float32 (exact for them), not copied to float64 first:
    the sums equal the float64 formula."""
    from headprune_cli.stages.score.importance.neurons import NeuronTaps

    model, data, _ = _setup(tmp_path, "llama-gqa", "text")
    taps = NeuronTaps(ScoreContext(model, data, "causal-lm", ffn=True))
    gen = torch.Generator().manual_seed(0)
    x, grad = (torch.randn(3, 5, 48, generator=gen).to(dtype) for _ in range(2))
    before = grad.clone()
    taps._add(1, grad, x)  # what the tap's backward hands on
    assert torch.equal(grad, before)  # autograd passes the same gradient on: the tap must not write into it
    term = grad.double() * x.double()
    per_example = term.sum(1)
    for key, want in (
        ("abs", per_example.abs().sum(0)),
        ("sq", (per_example**2).sum(0)),
        ("taylor", term.abs().sum((0, 1))),
    ):
        torch.testing.assert_close(taps.sums[key][1], want, rtol=1e-12, atol=0, msg=key)
    assert not taps.sums["abs"][0].any()  # only the layer the hook belongs to


def test_the_artifact_stores_neuron_scores_compactly_and_reads_them_back(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    model, data, path = _setup(tmp_path, "bert", "jsonl")
    save(model, tmp_path / "m.safetensors")
    out = tmp_path / "s.json"
    assert cli("score", tmp_path / "m.safetensors", "--data", path, "--method", "taylor", "--ffn", "-o", out).code == 0
    raw = json.loads(out.read_text())
    assert raw["ffn"]["encoding"] == "float32-le-base64" and raw["ffn"]["width"] == [48, 48, 48]
    assert raw["ffn"]["layers"]["0"]["kept"] == [[0, 48]] and isinstance(raw["ffn"]["layers"]["0"]["scores"], str)
    table = ScoreTable.from_scores(read_artifact(out, ("scores",))[0])
    direct = score_model(model, data, "taylor", ffn=True)
    for layer in direct.ffn:
        assert table.ffn[layer] == pytest.approx(direct.ffn[layer], rel=1e-6)  # float32 in the file
    again = tmp_path / "again.json"
    assert (
        cli("score", tmp_path / "m.safetensors", "--data", path, "--method", "taylor", "--ffn", "-o", again).code == 0
    )
    assert again.read_bytes() == out.read_bytes()
    plain = tmp_path / "plain.json"
    assert cli("score", tmp_path / "m.safetensors", "--data", path, "--method", "taylor", "-o", plain).code == 0
    assert "ffn" not in json.loads(plain.read_text()) and "ffn_width" not in plain.read_text()


@pytest.mark.parametrize("method", ["loo", "entropy", "combined", "l0"])
def test_methods_that_cannot_score_neurons_are_refused_before_any_work(tmp_path, cli, method):
    model, _, path = _setup(tmp_path, "reference", "jsonl")
    save(model, tmp_path / "m.safetensors")
    result = cli(
        "score", tmp_path / "m.safetensors", "--data", path, "--method", method, "--ffn", "-o", tmp_path / "s.json"
    )
    assert_refused(result, 2, f"method '{method}' scores no FFN neurons")
    assert not (tmp_path / "s.json").exists()


def _cut_flops(model, selection, seq_len: int) -> float:
    apply_plan(model, selection.remove_heads, selection.remove_layers, remove_ffn=selection.remove_ffn)
    return flops_per_token(model, seq_len)


@pytest.mark.parametrize(("name", "kind"), FAMILIES)
@pytest.mark.parametrize("target", [0.7, 0.45])
def test_one_flops_budget_over_heads_and_neurons_predicts_the_cut_exactly(tmp_path, name, kind, target):
    model, data, _ = _setup(tmp_path, name, kind)
    table = score_model(model, data, "fisher", batch_size=5, ffn=True, seq_len=32)
    c = Constraints(ffn_multiple_of=4, min_ffn=8)
    selection = select(table, budget=Budget("flops", target), constraints=c)
    before = flops_per_token(model, 32)
    assert selection.remove_ffn, "a deep FLOPs cut of a model whose FFN is most of its cost takes neurons"
    after = _cut_flops(model, selection, 32)
    assert after == pytest.approx(selection.predicted["after"]["flops_per_token"], rel=1e-9)
    assert after <= target * before * (1 + 1e-9)
    layout = info_of(model).layout
    for layer in layout.layers:
        width = layout.ffn_width(layer)
        assert width >= 8 and width % 4 == 0


@pytest.mark.parametrize("shape", [{}, {"uniform_heads": True}])
def test_layers_dropped_by_count_count_as_saved_when_neurons_fill_the_budget(tmp_path, shape):
    # A dropped layer's cost is gone: the heads and neurons chosen after it only fill what is left.
    model, data, _ = _setup(tmp_path, "llama-gqa", "text")
    table = score_model(model, data, "fisher", batch_size=5, ffn=True, layers="loo", seq_len=32)
    c = Constraints(ffn_multiple_of=1, drop_layers=1, **shape)
    selection = select(table, budget=Budget("flops", 0.5), constraints=c)
    before, after = (selection.predicted[k]["flops_per_token"] for k in ("before", "after"))
    assert len(selection.remove_layers) == 1
    # The greedy stops at the first step that fits: it lands under the limit by less than one step
    # (a KV group of query heads, or one neuron).
    step = max(c.q_head_flops * c.group_size + c.kv_head_flops for c in table.cost.layers)
    assert 0.5 * before - step <= after <= 0.5 * before * (1 + 1e-12)


def test_uniform_keeps_one_ffn_width_and_one_head_count(tmp_path):
    model, data, _ = _setup(tmp_path, "llama-gqa", "text")
    table = score_model(model, data, "taylor", batch_size=5, ffn=True, seq_len=32)
    selection = select(table, budget=Budget("flops", 0.6), constraints=Constraints(uniform=True))
    apply_plan(model, selection.remove_heads, selection.remove_layers, remove_ffn=selection.remove_ffn)
    layout = info_of(model).layout
    assert len({layout.ffn_width(l) for l in layout.layers}) == 1 and len({len(h) for h in layout.heads}) == 1
    assert layout.ffn_width(layout.layers[0]) < 48


def test_loss_scale_layer_scores_weigh_layers_against_heads_and_neurons(tmp_path):
    model, data, _ = _setup(tmp_path, "reference", "jsonl", rows=12)
    table = score_model(model, data, "taylor", batch_size=6, ffn=True, layers="loo", seq_len=32)
    assert set(table.ffn_loss) == set(info_of(model).layout.layers)
    # A layer whose FFN and heads both cost nothing to lose goes first as a whole block.
    table.layers = {l: (-1.0 if l == 1 else 5.0) for l in table.layers}
    selection = select(table, budget=Budget("flops", 0.6))
    assert selection.strategy == "joint" and 1 in selection.remove_layers
    assert 1 not in selection.remove_ffn and 1 not in selection.remove_heads
    assert selection.predicted["after"]["flops_per_token"] <= 0.6 * selection.predicted["before"]["flops_per_token"] * (
        1 + 1e-12
    )


def test_a_neuron_multiple_no_width_satisfies_is_refused(tmp_path, cli):
    model, _, path = _setup(tmp_path, "reference", "jsonl")
    save(model, tmp_path / "m.safetensors")
    scores = tmp_path / "s.json"
    assert (
        cli("score", tmp_path / "m.safetensors", "--data", path, "--method", "fisher", "--ffn", "-o", scores).code == 0
    )
    result = cli("select", scores, "--target-flops", "0.5", "--ffn-multiple-of", "64", "-o", tmp_path / "p.json")
    assert_refused(result, 2, "--ffn-multiple-of 64")
    assert not (tmp_path / "p.json").exists()


def test_a_corrupt_neuron_score_block_is_refused(tmp_path, cli):
    model, _, path = _setup(tmp_path, "reference", "jsonl")
    save(model, tmp_path / "m.safetensors")
    scores = tmp_path / "s.json"
    assert (
        cli("score", tmp_path / "m.safetensors", "--data", path, "--method", "fisher", "--ffn", "-o", scores).code == 0
    )
    data = json.loads(scores.read_text())
    data["ffn"]["layers"]["1"]["scores"] = data["ffn"]["layers"]["1"]["scores"][:-8]
    scores.write_text(json.dumps(data))
    result = cli("select", scores, "--target-flops", "0.5", "-o", tmp_path / "p.json")
    assert_refused(result, 1, "ffn.layers.1.scores")
    assert not (tmp_path / "p.json").exists()


def test_score_select_prune_pipe_cuts_heads_and_neurons(tmp_path, cli):
    model, _, path = _setup(tmp_path, "bert", "jsonl")
    save(model, tmp_path / "m.safetensors")
    scores = cli("score", tmp_path / "m.safetensors", "--data", path, "--method", "fisher", "--ffn")
    plan = cli("select", "--target-flops", "0.5", stdin=scores.out)
    assert plan.code == 0, plan.err
    assert json.loads(plan.out)["remove_ffn"]
    result = cli("prune", "-o", tmp_path / "small.safetensors", stdin=plan.out)
    assert result.code == 0, result.err
    facts = json.loads(cli("inspect", tmp_path / "small.safetensors", "--json").out)
    plan_data = json.loads(plan.out)
    assert facts["params"] == plan_data["predicted"]["after"]["params"]
    assert facts["ffn"] == {str(l): 48 - len(plan_data["remove_ffn"].get(str(l), [])) for l in range(3)}


def test_gradient_with_neurons_needs_unnormalised_scores(tmp_path):
    model, data, _ = _setup(tmp_path, "reference", "jsonl")
    with pytest.raises(Exception, match="--no-normalize"):
        score_model(model, data, "gradient", ffn=True)
    assert score_model(model, data, "gradient", ffn=True, normalize=False).ffn
