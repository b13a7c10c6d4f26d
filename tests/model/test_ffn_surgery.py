"""FFN neurons as a pruning unit, on every family: removing neurons equals gating them to
0, with heads and layers too; save/load of an FFN-pruned model is exact; gate gradients
exist per neuron; bad plans are refused before anything is cut."""

import pytest
import torch

from headprune_cli import load, save
from headprune_cli.errors import PlanError
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.ffn import removal_ffn_gates
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import HeadGates, NeuronGates, apply_plan, removal_gates, skip_layers
from tests.support import TINY, ffn_plan, model_inputs, model_output, plan_for, width_of

WIDTH = 48  # every TINY model's FFN width, but GPT-2's (4 x 32)


def gated_output(model, inputs, remove_heads, remove_ffn, drop=()):
    with (
        HeadGates(model, removal_gates(model, remove_heads)),
        NeuronGates(model, removal_ffn_gates(model, remove_ffn)),
        skip_layers(model, list(drop)),
    ):
        return model_output(model, inputs)


def test_removing_neurons_equals_gating_them(family):
    model = TINY[family]()
    inputs = model_inputs(family)
    gated = gated_output(model, inputs, {}, ffn_plan(family))
    apply_plan(model, {}, [], ffn_plan(family))
    assert torch.allclose(model_output(model, inputs), gated, atol=1e-5, rtol=1e-4)
    adapter = adapter_for(model)
    widths = [adapter.ffn(block).width for block in adapter.layer_list(model)]
    w = width_of(family)
    assert widths == [w - len(ffn_plan(family)[0]), w, w - 13]
    assert info_of(model).layout.ffn[2] == [n for n in range(w) if n not in ffn_plan(family)[2]]


def test_gating_neurons_changes_the_output(family):
    # the comparison above would pass if gates did nothing and removal did nothing
    model = TINY[family]()
    inputs = model_inputs(family)
    assert not torch.allclose(gated_output(model, inputs, {}, ffn_plan(family)), model_output(model, inputs), atol=1e-6)


def test_heads_neurons_and_layers_together_equal_gating(family):
    model = TINY[family]()
    inputs = model_inputs(family)
    heads = {k: v for k, v in plan_for(family).items() if k != 1}
    neurons = {0: ffn_plan(family)[0], 2: ffn_plan(family)[2]}
    gated = gated_output(model, inputs, heads, neurons, drop=[1])
    apply_plan(model, heads, [1], neurons)
    assert torch.allclose(model_output(model, inputs), gated, atol=1e-5, rtol=1e-4)
    assert info_of(model).layout.layers == [0, 2] and sorted(info_of(model).layout.ffn) == [0, 2]


def test_cutting_twice_speaks_original_indices(family):
    model, reference = TINY[family](), TINY[family]()
    inputs = model_inputs(family)
    first, second = {0: [0, 1, 2]}, {0: [3, 7], 1: [4]}
    apply_plan(model, {}, [], first)
    apply_plan(model, {}, [], second)
    apply_plan(reference, {}, [], {0: [0, 1, 2, 3, 7], 1: [4]})
    assert torch.equal(model_output(model, inputs), model_output(reference, inputs))
    with pytest.raises(PlanError, match=r"layer 0: FFN neurons \[1\] are not in the model"):
        apply_plan(model, {}, [], {0: [1]})


def test_ffn_pruned_model_round_trips_exactly(family, tmp_path):
    model = TINY[family]()
    inputs = model_inputs(family)
    apply_plan(model, plan_for(family), [1], {0: ffn_plan(family)[0], 2: ffn_plan(family)[2]})
    save(model, tmp_path / "m.safetensors")
    back = load(tmp_path / "m.safetensors")
    assert torch.equal(model_output(back, inputs), model_output(model, inputs))
    assert info_of(back).layout == info_of(model).layout
    assert info_of(back).layout.num_ffn == [width_of(family)] * 3
    save(back, tmp_path / "again.safetensors")  # the reloaded model writes the same layout and tensors
    layout, tensors = _layout_and_tensors(tmp_path / "m.safetensors")
    again_layout, again = _layout_and_tensors(tmp_path / "again.safetensors")
    assert again_layout == layout and '"ffn"' in layout
    assert again.keys() == tensors.keys() and all(torch.equal(again[k], tensors[k]) for k in tensors)


def _layout_and_tensors(path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        # safe_open has keys() but no __iter__
        return handle.metadata()["headprune.layout"], {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118


def test_every_layer_cut_loads(tmp_path):
    # the unpruned config's intermediate_size then matches no stored tensor
    model = TINY["llama"]()
    apply_plan(model, {}, [], {layer: list(range(10)) for layer in range(3)})
    save(model, tmp_path / "m.safetensors")
    assert torch.equal(
        model_output(load(tmp_path / "m.safetensors"), model_inputs("llama")),
        model_output(model, model_inputs("llama")),
    )


def test_neuron_gate_gradients_are_one_backward_pass():
    model = TINY["llama"]()
    inputs = model_inputs("llama")
    gates = [torch.ones(WIDTH, requires_grad=True) for _ in range(3)]
    with NeuronGates(model, gates):
        out = model(**inputs, labels=inputs["input_ids"])
    out.loss.backward()
    assert all(g.grad is not None and g.grad.shape == (WIDTH,) and g.grad.abs().sum() > 0 for g in gates)
    # first order: gating neuron n to 0 changes the loss by about -grad[n]
    n = int(gates[1].grad.abs().argmax())
    off = [torch.ones(WIDTH) for _ in range(3)]
    off[1][n] = 0.0
    with torch.no_grad(), NeuronGates(model, off):
        changed = model(**inputs, labels=inputs["input_ids"]).loss
    assert torch.isclose(changed - out.loss.detach(), -gates[1].grad[n], rtol=0.3, atol=1e-4)


def test_per_example_and_per_token_neuron_gates():
    model = TINY["bert"]()
    inputs = model_inputs("bert")
    per_example = [torch.ones(2, WIDTH) for _ in range(3)]
    per_example[0][1, :] = 0.0  # second example loses layer 0's FFN
    with NeuronGates(model, per_example):
        mixed = model_output(model, inputs)
    with NeuronGates(model, [torch.zeros(WIDTH), torch.ones(WIDTH), torch.ones(WIDTH)]):
        all_off = model_output(model, inputs)
    assert torch.allclose(mixed[0], model_output(model, inputs)[0]) and torch.allclose(mixed[1], all_off[1])
    # per token, in the last layer of a causal model: only that token's output moves
    model, inputs = TINY["llama"](), model_inputs("llama")
    per_token = [torch.ones(2, 7, WIDTH) for _ in range(3)]
    per_token[2][0, 3, :5] = 0.0
    with NeuronGates(model, per_token):
        gated = model_output(model, inputs)
    moved = (gated - model_output(model, inputs)).abs().amax(-1) > 1e-6
    assert moved.tolist() == [[False, False, False, True, False, False, False], [False] * 7]


@pytest.mark.parametrize(
    ("remove_ffn", "layers", "message"),
    [
        ({0: [WIDTH]}, [], r"layer 0: FFN neurons \[48\] are not in the model"),
        ({0: [-1]}, [], r"neuron '-1' is not a non-negative integer"),
        ({0: [3, 3, 4]}, [], r"remove_ffn.0: neurons listed twice: \[3\]"),
        ({1: [3]}, [1], r"layer 1 is also in remove_layers"),
        ({0: list(range(WIDTH))}, [], r"removing every FFN neuron is only allowed when the plan also drops the layer"),
        ({7: [0]}, [], r"remove_ffn: layer 7 is not in this model"),
    ],
)
def test_bad_ffn_plans_are_refused_before_any_cut(remove_ffn, layers, message):
    model = TINY["llama"]()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(PlanError, match=message):
        apply_plan(model, {0: [1]}, layers, remove_ffn)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert info_of(model).layout.ffn == {} and info_of(model).layout.heads[0] == [0, 1, 2, 3]
