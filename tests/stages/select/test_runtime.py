"""`select --runtime`: plans constrained to what the serving engine loads (stages/select/runtime.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import transformers as T

from headprune_cli import save
from headprune_cli.data.readers import read_data
from headprune_cli.errors import UsageError
from headprune_cli.model.formats.vllm import nas_plan
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import apply_plan
from headprune_cli.stages.budget import Budget, BudgetUnreachable
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.score.importance import score_model
from headprune_cli.stages.select.strategies import select
from tests.support import TINY, assert_refused, give_tokenizer, write_text


@pytest.fixture()
def scored(tmp_path):
    model = give_tokenizer(TINY["llama-gqa"](), encoder=False)
    data = read_data(write_text(tmp_path / "d.txt", 10), model)
    return model, score_model(model, data, "taylor", batch_size=5, ffn=True, seq_len=32), tmp_path


def shapes(model) -> tuple[set, set, list[int]]:
    layout = info_of(model).layout
    heads = {(len(q), len(kv)) for q, kv in zip(layout.heads, layout.kv_heads)}
    return heads, {layout.ffn_width(layer) for layer in layout.layers}, [layout.ffn_width(l) for l in layout.layers]


def test_vllm_keeps_one_head_count_and_chooses_ffn_widths_per_layer(scored):
    model, table, _ = scored
    selection = select(table, budget=Budget("flops", 0.6), constraints=Constraints(uniform_heads=True))
    after, before = selection.predicted["after"], selection.predicted["before"]
    assert after["flops_per_token"] <= 0.6 * before["flops_per_token"] * (1 + 1e-12)
    apply_plan(model, selection.remove_heads, selection.remove_layers, remove_ffn=selection.remove_ffn)
    heads, widths, per_layer = shapes(model)
    assert len(heads) == 1  # one (query heads, KV heads) in every layer: nemotron-nas states it
    assert len(widths) > 1, per_layer  # the FFN widths follow the scores layer by layer
    assert nas_plan(info_of(model)).ffn == per_layer  # the vLLM export takes it as it is


def test_vllm_removes_nothing_when_the_model_meets_the_budget_already(scored):
    """A FLOPs budget of 1.0 is met by the unpruned model: no FFN step (nor head) is needed."""
    _, table, _ = scored
    selection = select(table, budget=Budget("flops", 1.0), constraints=Constraints(uniform_heads=True))
    assert (selection.remove_heads, selection.remove_ffn, selection.remove_layers) == ({}, {}, [])


def test_vllm_meets_a_target_equal_to_its_own_plans_share(scored):
    """A plan's FLOPs share (after / before, as the plan records it), given back as the target,
    is met by that same plan: the budget compares with the slack for rounding, not strictly."""
    _, table, _ = scored
    first = select(table, budget=Budget("flops", 0.6), constraints=Constraints(uniform_heads=True))
    share = first.predicted["after"]["flops_per_token"] / first.predicted["before"]["flops_per_token"]
    again = select(table, budget=Budget("flops", share), constraints=Constraints(uniform_heads=True))
    assert (again.remove_heads, again.remove_ffn) == (first.remove_heads, first.remove_ffn)


def test_vllm_refuses_a_budget_no_common_head_count_meets(scored):
    _, table, _ = scored
    with pytest.raises(BudgetUnreachable, match="no common head count and FFN width fits it"):
        select(table, budget=Budget("flops", 0.01), constraints=Constraints(uniform_heads=True))


def test_vllm_loses_no_more_score_than_transformers_at_the_same_budget(scored):
    """The transformers rule (one FFN width) is a special case of vLLM's, so the FFN-free choice
    never removes more score."""
    _, table, _ = scored

    def removed(c: Constraints) -> float:
        sel = select(table, budget=Budget("flops", 0.6), constraints=c)
        ffn = sum(table.ffn[l][table.ffn_kept[l].index(n)] for l, ns in sel.remove_ffn.items() for n in ns)
        return ffn + sum(table.heads[l][h] for l, hs in sel.remove_heads.items() for h in hs)

    assert removed(Constraints(uniform_heads=True)) <= removed(Constraints(uniform=True)) + 1e-12


def test_the_cli_records_the_runtime_and_applies_its_rule(scored, cli):
    model, _, tmp_path = scored
    save(model, tmp_path / "m.safetensors")
    scores = tmp_path / "s.json"
    data = tmp_path / "d.txt"
    assert (
        cli("score", tmp_path / "m.safetensors", "--data", data, "--method", "taylor", "--ffn", "-o", scores).code == 0
    )
    for runtime, uniform in (("transformers", True), ("vllm", False), ("llama.cpp", False)):
        out = tmp_path / f"{runtime}.json"
        assert cli("select", scores, "--target-flops", "0.6", "--runtime", runtime, "-o", out).code == 0
        plan = json.loads(out.read_text())
        assert plan["constraints"]["runtime"] == runtime
        assert plan["constraints"]["uniform"] is uniform
        assert plan["constraints"].get("uniform_heads", False) is (runtime == "vllm")
    plain = tmp_path / "plain.json"
    assert cli("select", scores, "--target-flops", "0.6", "-o", plain).code == 0
    assert "runtime" not in json.loads(plain.read_text())["constraints"]  # plans without it keep their bytes


def test_an_unknown_runtime_is_refused_before_anything_is_written(scored, cli):
    model, _, tmp_path = scored
    save(model, tmp_path / "m.safetensors")
    scores = tmp_path / "s.json"
    assert cli("score", tmp_path / "m.safetensors", "--data", tmp_path / "d.txt", "-o", scores).code == 0
    result = cli("select", scores, "--ratio", "0.3", "--runtime", "tgi", "-o", tmp_path / "p.json")
    assert_refused(result, 2, "unknown --runtime 'tgi'")
    assert not (tmp_path / "p.json").exists()


class _Neurons:
    def __init__(self, steps: int):
        self.allowed = list(range(steps))  # allowed prefixes: index f removes f steps of neurons


class _Layer:
    """A layer whose f-th FFN step costs `neuron_paid[f]` of loss and saves `saves` units of cost."""

    def __init__(self, neuron_paid: list[float], saves: float = 10.0):
        self.neuron_paid = neuron_paid
        self.neurons = _Neurons(len(neuron_paid))
        self.saves = saves  # cost saved by each FFN step

    def price(self, h: int, f: int) -> float:
        return 100.0 - self.saves * f

    def paid(self, h: int, f: int) -> float:
        return self.neuron_paid[f]


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (190.0, {0: [0, 1], 1: [0, 0]}),  # one step: layer 0's costs 1 / 10, layer 1's 5 / 10
        (180.0, {0: [0, 1], 1: [0, 1]}),  # layer 0's second step costs 6 / 10: layer 1's is cheaper
        (170.0, {0: [0, 1], 1: [0, 2]}),  # then layer 1's second (5 / 10) before layer 0's (6 / 10)
        (160.0, {0: [0, 2], 1: [0, 2]}),
    ],
)
def test_vllm_ffn_steps_go_to_the_least_loss_per_cost_saved(limit, expected):
    from headprune_cli.stages.select.runtime import _fill_ffn

    layers = {0: _Layer([0.0, 1.0, 7.0, 8.0]), 1: _Layer([0.0, 5.0, 10.0, 30.0])}
    state = {0: [0, 0], 1: [0, 0]}
    assert _fill_ffn(layers, state, lambda s: sum(layers[l].price(*s[l]) for l in s) <= limit)
    assert state == expected


def test_vllm_ffn_steps_run_out_when_nothing_fits():
    from headprune_cli.stages.select.runtime import _fill_ffn

    layers = {0: _Layer([0.0, 1.0]), 1: _Layer([0.0, 2.0])}
    state = {0: [0, 0], 1: [0, 0]}
    assert not _fill_ffn(layers, state, lambda s: False)
    assert state == {0: [0, 1], 1: [0, 1]}  # every step taken before giving up


# check_serves: which scored checkpoints an engine takes. The expected lists are docs/serving.md's:
# vLLM's nemotron-nas takes llama, mistral and qwen2; llama.cpp's GGUF also qwen3.
VLLM_SERVES = "(llama, mistral, qwen2)"
LLAMA_CPP_SERVES = "(llama, mistral, qwen2, qwen3)"


def _scores_naming(model: str, objective: str = "causal-lm"):
    """What check_serves reads of a scores artifact: its model input and its objective."""
    return SimpleNamespace(kind="scores", inputs=[SimpleNamespace(role="model", path=model)], objective=objective)


def _refusal(runtime: str, scores, source: str | None) -> str | None:
    from headprune_cli.stages.select.runtime import check_serves

    try:
        check_serves(runtime, scores, source)
    except UsageError as refused:
        return str(refused)
    return None


def _llama_classifier():
    config = T.LlamaConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    config.update({"intermediate_size": 48, "num_labels": 2, "pad_token_id": 0})
    return T.LlamaForSequenceClassification(config)


@pytest.mark.parametrize(
    ("runtime", "family", "what"),
    [
        ("vllm", "llama", None),
        ("vllm", "mistral", None),
        ("vllm", "qwen2", None),
        ("vllm", "qwen3", "a qwen3 causal-lm"),  # GGUF writes Qwen3, nemotron-nas does not
        ("llama.cpp", "qwen3", None),
        ("llama.cpp", "llama", None),
        ("vllm", "gpt2", "a gpt2 causal-lm"),
        ("llama.cpp", "gpt2", "a gpt2 causal-lm"),
        ("llama.cpp", "bert", "a bert classification"),
        ("vllm", "reference", "a headprune-reference classification"),  # named by its model_type
        ("vllm", "llama-classifier", "a llama classification"),  # a LLaMA, but not a causal LM
        ("llama.cpp", "llama-classifier", "a llama classification"),
    ],
)
def test_an_engine_serves_only_the_llama_family_causal_lms_it_loads(tmp_path, monkeypatch, runtime, family, what):
    model = _llama_classifier() if family == "llama-classifier" else TINY[family]()
    save(model, tmp_path / "m.safetensors")
    monkeypatch.chdir(tmp_path.parent)  # the scores name their model beside them, not in the working folder
    refusal = _refusal(runtime, _scores_naming("m.safetensors"), str(tmp_path / "s.json"))
    if what is None:
        assert refusal is None
        return
    served = VLLM_SERVES if runtime == "vllm" else LLAMA_CPP_SERVES
    assert refusal == (
        f"--runtime {runtime} serves LLaMA-family causal LMs {served}; the scored model "
        f"{tmp_path / 'm.safetensors'} is {what}: choose --runtime onnxruntime or transformers"
    )


@pytest.mark.parametrize("runtime", [None, "transformers", "onnxruntime"])
def test_the_other_engines_serve_any_scored_model(tmp_path, runtime):
    save(TINY["bert"](), tmp_path / "m.safetensors")
    assert _refusal(runtime, _scores_naming(str(tmp_path / "m.safetensors"), "classification"), None) is None


@pytest.mark.parametrize("runtime", ["vllm", "llama.cpp"])
def test_without_the_checkpoint_only_classifier_scores_are_refused(tmp_path, runtime):
    gone = str(tmp_path / "gone.safetensors")
    served = VLLM_SERVES if runtime == "vllm" else LLAMA_CPP_SERVES
    assert _refusal(runtime, _scores_naming(gone, "classification"), None) == (
        f"--runtime {runtime} serves LLaMA-family causal LMs {served}; these scores are of a classifier: "
        "choose --runtime onnxruntime or transformers"
    )
    assert _refusal(runtime, _scores_naming(gone, "causal-lm"), None) is None  # export refuses the rest


def test_vllm_ffn_steps_are_ranked_by_loss_per_unit_of_cost_saved():
    """Layer 0's step loses 2 and saves 10 (0.2 a unit); layer 1's loses 3 and saves 30 (0.1 a
    unit): layer 1's goes first, though it loses more."""
    from headprune_cli.stages.select.runtime import _fill_ffn

    layers = {0: _Layer([0.0, 2.0], saves=10.0), 1: _Layer([0.0, 3.0], saves=30.0)}
    state = {0: [0, 0], 1: [0, 0]}
    assert _fill_ffn(layers, state, lambda s: sum(layers[l].price(*s[l]) for l in s) <= 175.0)
    assert state == {0: [0, 0], 1: [0, 1]}


def test_vllm_ffn_steps_that_save_nothing_are_never_taken_and_small_savings_are():
    """A step that saves no cost is no step; one that saves half a unit is."""
    from headprune_cli.stages.select.runtime import _fill_ffn

    layers = {0: _Layer([0.0, 0.0, 0.0], saves=0.0), 1: _Layer([0.0, 1.0, 2.0], saves=0.5)}
    state = {0: [0, 0], 1: [0, 0]}
    assert _fill_ffn(layers, state, lambda s: sum(layers[l].price(*s[l]) for l in s) <= 199.0)
    assert state == {0: [0, 0], 1: [0, 2]}
