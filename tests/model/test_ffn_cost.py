"""FFN neurons in the cost: a table with FFN prices predicts params and FLOPs of any plan
(heads, neurons and layers together) exactly as counted on the cut model; a table
without them keeps its old form; `inspect` shows the widths."""

import json

import pytest

from headprune_cli import save
from headprune_cli.errors import PlanError
from headprune_cli.model.cost import cost_table, count_params, flops_per_token
from headprune_cli.model.cost_table import CostTable, predict
from headprune_cli.model.describe import describe
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import apply_plan
from tests.support import TINY, ffn_plan, plan_for

SEQ = 16


def _kept(model) -> dict[int, list[int]]:
    layout = info_of(model).layout
    return dict(zip(layout.layers, layout.heads))


def test_ffn_prices_predict_the_cut_model_exactly(family):
    model = TINY[family]()
    table = CostTable.from_dict(json.loads(json.dumps(cost_table(model, SEQ, ffn=True).to_dict())))
    heads = {k: v for k, v in plan_for(family).items() if k != 1}
    neurons = {0: ffn_plan(family)[0], 2: ffn_plan(family)[2]}
    predicted = predict(table, _kept(model), heads, [1], neurons)
    full = predict(table, _kept(model))
    apply_plan(model, heads, [1], neurons)
    assert predicted["params"] == count_params(model)
    assert predicted["flops_per_token"] == pytest.approx(flops_per_token(model, SEQ), rel=1e-12)
    assert full["params"] > predicted["params"]


def test_prices_of_an_already_cut_model_predict_a_second_cut(family):
    model = apply_plan(TINY[family](), {}, [], {0: [0, 1, 2, 3]})
    table = cost_table(model, SEQ, ffn=True)
    assert table.layers[0].ffn_width == table.layers[1].ffn_width - 4
    predicted = predict(table, _kept(model), {}, [], {0: [4, 5], 1: [7]})
    apply_plan(model, {}, [], {0: [4, 5], 1: [7]})
    assert predicted["params"] == count_params(model)
    assert predicted["flops_per_token"] == pytest.approx(flops_per_token(model, SEQ), rel=1e-12)


def test_a_table_without_ffn_prices_is_what_it_was():
    model = TINY["llama"]()
    plain, priced = cost_table(model, SEQ), cost_table(model, SEQ, ffn=True)
    assert "ffn_width" not in plain.to_dict()["layers"][0] and priced.to_dict()["layers"][0]["ffn_width"] == 48
    # the same totals either way
    assert predict(plain, _kept(model)) == pytest.approx(predict(priced, _kept(model)))
    with pytest.raises(PlanError, match="no FFN prices"):
        predict(plain, _kept(model), remove_ffn={0: [1]})


def test_describe_lists_ffn_widths_and_counts_the_cut(tmp_path):
    model = TINY["gpt2"]()
    before = describe(model, SEQ)
    apply_plan(model, {}, [1], {0: list(range(28))})
    facts = describe(model, SEQ)
    assert before["ffn"] == {"0": 128, "1": 128, "2": 128}
    assert facts["ffn"] == {"0": 100, "2": 128} and facts["original_ffn"] == {"0": 128, "1": 128, "2": 128}
    assert facts["params"] == count_params(model) < before["params"]


def test_inspect_shows_ffn_widths(tmp_path, cli):
    save(apply_plan(TINY["bert"](), {}, [], {1: list(range(8))}), tmp_path / "m.safetensors")
    result = cli("inspect", tmp_path / "m.safetensors", "--json")
    assert result.code == 0 and json.loads(result.out)["ffn"] == {"0": 48, "1": 40, "2": 48}
    table = cli("inspect", tmp_path / "m.safetensors")
    assert table.code == 0 and "FFN width" in table.err and "40/48" in table.err  # the table is for people: stderr
