"""On every family: gating equals removal, save/load is exact, layer drops."""

import pytest
import torch

from headprune_cli import load, save
from headprune_cli.errors import ArchitectureError, PlanError
from headprune_cli.model.cost import cost_table, count_params, flops_per_token
from headprune_cli.model.cost_table import predict
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import HeadGates, apply_plan, removal_gates, skip_layers
from tests.support import CAUSAL, TINY, model_inputs, model_output, plan_for


def test_removing_heads_equals_gating_them(family):
    model = TINY[family]()
    inputs = model_inputs(family)
    remove = plan_for(family)
    with HeadGates(model, removal_gates(model, remove)):
        gated = model_output(model, inputs)
    apply_plan(model, remove, [])
    removed = model_output(model, inputs)
    torch.testing.assert_close(removed, gated, atol=1e-5, rtol=0)
    for layer, heads in remove.items():
        pos = info_of(model).layout.position(layer)
        assert not set(heads) & set(info_of(model).layout.heads[pos])


def test_save_load_is_exact(family, tmp_path):
    model = TINY[family]()
    apply_plan(model, plan_for(family), [1])
    path = tmp_path / "m.safetensors"
    save(model, path)
    again = load(path)
    inputs = model_inputs(family)
    assert torch.equal(model_output(again, inputs), model_output(model, inputs))
    assert info_of(again).layout == info_of(model).layout
    assert {k: v.shape for k, v in again.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}


def test_dropping_a_layer_equals_skipping_it(family):
    model = TINY[family]()
    inputs = model_inputs(family)
    with skip_layers(model, [1]):
        skipped = model_output(model, inputs)
    apply_plan(model, {}, [1])
    torch.testing.assert_close(model_output(model, inputs), skipped, atol=1e-5, rtol=0)
    assert info_of(model).layout.layers == [0, 2]


def test_a_skipped_block_passes_its_input_through_however_it_was_called():
    """Blocks are called with the hidden states by position or by keyword, and return a
    tensor or a tuple whose first item is the hidden states."""
    from headprune_cli.model.surgery import _identity_hook

    hidden, extra = torch.randn(2, 3, 4), torch.randn(1)
    assert _identity_hook(None, (hidden,), {}, torch.zeros(2, 3, 4)) is hidden
    by_keyword = _identity_hook(
        None, (), {"hidden_states": hidden, "attention_mask": None}, (torch.zeros(2, 3, 4), extra)
    )
    assert by_keyword[0] is hidden and by_keyword[1] is extra and len(by_keyword) == 2


def test_cost_prediction_matches_the_pruned_model(family):
    model = TINY[family]()
    layout = info_of(model).layout
    table = cost_table(model, seq_len=16)
    expected = predict(table, dict(zip(layout.layers, layout.heads)), plan_for(family), [1])
    apply_plan(model, plan_for(family), [1])
    assert expected["params"] == count_params(model)
    assert expected["flops_per_token"] == pytest.approx(flops_per_token(model, 16), rel=1e-9)


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_lm_generates_with_kv_cache_after_layer_removal(name):
    model = TINY[name]()
    prompt = model_inputs(name, batch=1, seq=5)["input_ids"]
    settings = dict(max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
    with torch.no_grad(), skip_layers(model, [1]), HeadGates(model, removal_gates(model, plan_for(name))):
        reference = model.generate(prompt, **settings, output_scores=True, return_dict_in_generate=True)
    apply_plan(model, plan_for(name), [1])
    with torch.no_grad():
        pruned = model.generate(prompt, **settings, output_scores=True, return_dict_in_generate=True)
    assert torch.equal(pruned.sequences, reference.sequences)
    torch.testing.assert_close(torch.stack(pruned.scores), torch.stack(reference.scores), atol=1e-5, rtol=0)
    assert [layer.self_attn.layer_idx for layer in _blocks(model)] == list(range(len(_blocks(model))))


def _blocks(model):
    from headprune_cli.model.arch import adapter_for

    blocks = adapter_for(model).layer_list(model)
    return [b for b in blocks if hasattr(b, "self_attn")] or [type("B", (), {"self_attn": b.attn})() for b in blocks]


def test_removing_every_head_of_a_layer_needs_the_layer_dropped():
    model = TINY["bert"]()
    with pytest.raises(PlanError, match="removing every head"):
        apply_plan(model, {1: [0, 1, 2, 3]}, [])
    apply_plan(model, {1: [0, 1, 2, 3]}, [1])
    assert info_of(model).layout.layers == [0, 2]
    with pytest.raises(PlanError, match="^the plan removes every layer; at least one must remain$"):
        apply_plan(model, {}, [0, 2])


def test_gqa_groups_must_stay_equal():
    model = TINY["llama-gqa"]()  # 8 query heads, 2 KV heads: groups {0..3}, {4..7}
    with pytest.raises(
        ArchitectureError, match=r"same number of query heads \(would keep kv head 0: 3, kv head 1: 4\)"
    ):
        apply_plan(model, {0: [0]}, [])
    apply_plan(model, {0: [0, 4]}, [])  # one query head from each group keeps groups equal
    layout = info_of(model).layout
    assert layout.heads[0] == [1, 2, 3, 5, 6, 7] and layout.kv_heads[0] == [0, 1]
    assert _blocks(model)[0].self_attn.num_key_value_groups == 3


def test_whole_gqa_group_removal_drops_its_kv_head():
    model = TINY["llama-gqa"]()
    apply_plan(model, {2: [4, 5, 6, 7]}, [])
    assert info_of(model).layout.kv_heads[2] == [0]
    assert _blocks(model)[2].self_attn.k_proj.out_features == 4


def test_removal_is_cumulative_in_original_indices(tmp_path):
    model = TINY["bert"]()
    inputs = model_inputs("bert")
    with HeadGates(model, removal_gates(model, {0: [0, 2]})):
        reference = model_output(model, inputs)
    apply_plan(model, {0: [2]}, [])
    save(model, tmp_path / "a.safetensors")
    again = load(tmp_path / "a.safetensors")
    apply_plan(again, {0: [0]}, [])  # original index 0, now at position 0 of [0, 1, 3]
    torch.testing.assert_close(model_output(again, inputs), reference, atol=1e-5, rtol=0)
    assert info_of(again).layout.heads[0] == [1, 3]
    with pytest.raises(PlanError, match="not in the model"):
        apply_plan(again, {0: [2]}, [])


def test_provenance_names_parent_and_root(tmp_path):
    model = TINY["reference"]()
    root = tmp_path / "root.safetensors"
    root_sha = save(model, root)
    child = load(root)
    apply_plan(child, {0: [0]}, [])
    child_sha = save(child, tmp_path / "child.safetensors", plan_sha="ab" * 32)
    grandchild = load(tmp_path / "child.safetensors")
    save(grandchild, tmp_path / "sub" / "g.safetensors") if (tmp_path / "sub").mkdir() is None else None
    prov = info_of(load(tmp_path / "sub" / "g.safetensors")).provenance
    assert prov["parent"] == child_sha and prov["root"] == root_sha and prov["plan"] is None
    assert (tmp_path / "sub" / prov["root_path"]).resolve() == root.resolve()
    assert info_of(load(tmp_path / "child.safetensors")).provenance["plan"] == "ab" * 32


def test_save_is_deterministic(tmp_path):
    for name in ("a", "b"):
        model = TINY["gpt2"]()
        apply_plan(model, {0: [1]}, [2])
        save(model, tmp_path / f"{name}.safetensors")
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_base_model_without_pooler_round_trips(tmp_path):
    import transformers as T

    model = T.BertModel(
        T.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48),
        add_pooling_layer=False,
    )
    model.eval()
    save(model, tmp_path / "m.safetensors")
    again = load(tmp_path / "m.safetensors")
    assert again.pooler is None
    inputs = model_inputs("bert")
    assert torch.equal(model_output(again, inputs), model_output(model, inputs))
