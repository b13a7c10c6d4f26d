"""Compensation of FFN neuron cuts: the down projection refit towards the unpruned FFN output."""

from __future__ import annotations

import copy

import pytest
import torch

from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import hidden_states_in, is_conv1d
from headprune_cli.model.ffn import removal_ffn_gates
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import HeadGates, NeuronGates, apply_plan, removal_gates, skip_layers
from headprune_cli.stages.prune.compensation import compensate
from tests.support import TINY, VOCAB, count_computed, model_inputs, model_output

FAMILIES = ("reference", "bert", "distilbert", "gpt2", "llama-gqa", "vit")
# Heads every family accepts (llama-gqa has 8 query heads in 2 KV groups: remove whole groups).
HEADS = {"llama-gqa": {0: [0, 1, 2, 3], 2: [4, 5, 6, 7]}}
DEFAULT_HEADS = {0: [1], 2: [0, 2]}


def calibration(family: str, n_batches: int = 3, seed: int = 1, batch: int = 8, seq: int = 10) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    if family == "vit":
        return [{"pixel_values": torch.randn(batch, 3, 16, 16, generator=gen)} for _ in range(n_batches)]
    out = []
    for _ in range(n_batches):
        ids = torch.randint(2, VOCAB, (batch, seq), generator=gen)
        mask = torch.ones_like(ids)
        mask[::3, -3:] = 0  # padding: left out of the statistics
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def half_of_every_ffn(model, seed: int = 0) -> dict[int, list[int]]:
    """Half the neurons of every layer, chosen at random (seeded)."""
    layout = info_of(model).layout
    gen = torch.Generator().manual_seed(seed)
    plan = {}
    for layer in layout.layers:
        width = layout.num_ffn[layer]
        plan[layer] = sorted(torch.randperm(width, generator=gen)[: width // 2].tolist())
    return plan


def down(model, layer: int):
    adapter = adapter_for(model)
    return adapter.ffn(adapter.layer_list(model)[info_of(model).layout.position(layer)]).down


@pytest.mark.parametrize("fit", ["full", "diag"])
@pytest.mark.parametrize("family", FAMILIES)
def test_lstsq_lowers_the_ffn_output_error_of_every_cut_layer(family, fit):
    model = TINY[family]()
    remove_ffn = half_of_every_ffn(model)
    result = compensate(model, {}, [], calibration(family), method="lstsq", remove_ffn=remove_ffn, ffn_fit=fit)
    assert result.ffn_layers == sorted(remove_ffn) and result.layers == [] and not result.ffn_skipped
    for layer in result.ffn_layers:
        assert 0 < result.ffn_error_after[layer] < result.ffn_error_before[layer], (layer, result)
    if family != "vit":  # padding is left out of the statistics
        assert result.tokens == sum(int(b["attention_mask"].sum()) for b in calibration(family))


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_bias_lowers_the_ffn_output_error_where_the_down_projection_has_a_bias(family):
    model = TINY[family]()
    before = {n: p.clone() for n, p in model.named_parameters()}
    remove_ffn = half_of_every_ffn(model)
    result = compensate(model, {}, [], calibration(family), method="bias", remove_ffn=remove_ffn)
    assert result.ffn_layers == [0, 1, 2]
    assert all(result.ffn_error_after[l] < result.ffn_error_before[l] for l in result.ffn_layers)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    # Only the down projections' biases move: the weights stay what they were.
    assert changed and all(n.endswith("bias") for n in changed), changed


@pytest.mark.parametrize(
    ("family", "heads", "drop"),
    [
        ("reference", DEFAULT_HEADS, [1]),
        ("bert", DEFAULT_HEADS, []),
        ("distilbert", {1: [0, 3]}, []),
        ("gpt2", DEFAULT_HEADS, [1]),
        ("llama-gqa", HEADS["llama-gqa"], [1]),
        ("vit", {}, []),
    ],
)
def test_the_cut_model_equals_the_compensated_model_with_its_units_gated(family, heads, drop):
    base = TINY[family]()
    remove_ffn = {l: n for l, n in half_of_every_ffn(base).items() if l not in drop}
    model = copy.deepcopy(base)
    result = compensate(model, heads, drop, calibration(family), method="lstsq", remove_ffn=remove_ffn)
    assert result.ffn_layers == sorted(remove_ffn) and result.layers == sorted(l for l in heads if l not in drop)
    inputs = model_inputs(family)
    with (
        torch.no_grad(),
        HeadGates(model, removal_gates(model, heads)),
        NeuronGates(model, removal_ffn_gates(model, remove_ffn)),
        skip_layers(model, drop),
    ):
        gated = model_output(model, inputs)
    apply_plan(model, heads, drop, remove_ffn=remove_ffn)
    torch.testing.assert_close(model_output(model, inputs), gated, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(gated, model_output(base, inputs))  # the plan changed something


def test_heads_and_ffn_compensate_together_better_than_heads_alone():
    base = TINY["bert"]()
    remove_ffn = half_of_every_ffn(base)
    held_out = calibration("bert", n_batches=2, seed=7)

    def error(model) -> float:
        return sum(float(((model_output(model, b) - model_output(base, b)) ** 2).sum()) for b in held_out)

    plain, fixed = copy.deepcopy(base), copy.deepcopy(base)
    apply_plan(plain, DEFAULT_HEADS, [], remove_ffn=remove_ffn)
    result = compensate(fixed, DEFAULT_HEADS, [], calibration("bert", n_batches=6), remove_ffn=remove_ffn)
    apply_plan(fixed, DEFAULT_HEADS, [], remove_ffn=remove_ffn)
    assert result.layers == [0, 2] and result.ffn_layers == [0, 1, 2]
    assert error(fixed) < error(plain)


def test_bias_on_a_family_without_an_mlp_bias_is_skipped_with_a_note():
    model = TINY["llama-gqa"]()
    before = copy.deepcopy(model.state_dict())
    result = compensate(model, {}, [], calibration("llama-gqa"), method="bias", remove_ffn={0: [1, 2], 2: [5]})
    assert result.ffn_layers == [] and sorted(result.ffn_skipped) == [0, 2]
    assert all("FFN down projection has no bias" in why for why in result.ffn_skipped.values())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_same_calibration_data_gives_bit_identical_weights():
    base = TINY["gpt2"]()
    remove_ffn = half_of_every_ffn(base)
    states = []
    for _ in range(2):
        model = copy.deepcopy(base)
        compensate(
            model, DEFAULT_HEADS, [1], calibration("gpt2"), remove_ffn={l: n for l, n in remove_ffn.items() if l != 1}
        )
        states.append(model.state_dict())
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert not torch.equal(
        states[0]["transformer.h.0.mlp.c_proj.weight"], base.state_dict()["transformer.h.0.mlp.c_proj.weight"]
    )


def test_a_plan_with_neither_heads_nor_neurons_returns_without_running_the_model():
    model = TINY["llama-gqa"]()
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    result = compensate(model, {0: []}, [], calibration("llama-gqa"), remove_ffn={1: []})
    hook.remove()
    assert calls == [] and result.layers == [] and result.ffn_layers == []


def _ridge_lstsq(x: torch.Tensor, y: torch.Tensor, w0: torch.Tensor, b0: torch.Tensor | None, ridge: float):
    """min sum_t |[x_t 1] W - y_t|^2 / |y_t|^2 + lam |W - W0|^2 as one augmented least-squares
    problem (every token's rows scaled by 1 / |y_t|), lam = ridge * mean of the weighted X^T X diagonal."""
    scale = 1 / y.norm(dim=1, keepdim=True)
    d = x.shape[1]
    if b0 is not None:
        x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    x, y = x * scale, y * scale
    lam = ridge * float((x[:, :d] * x[:, :d]).sum(0).mean())
    rows = torch.cat([torch.eye(d, dtype=x.dtype), torch.zeros(d, x.shape[1] - d, dtype=x.dtype)], 1) * lam**0.5
    solved = torch.linalg.lstsq(torch.cat([x, rows]), torch.cat([y, w0 * lam**0.5]), driver="gelsd").solution
    return solved[:d], (solved[d] if b0 is not None else None)


def _ridge_diag(x: torch.Tensor, y: torch.Tensor, w0: torch.Tensor, b0: torch.Tensor | None, ridge: float):
    """min sum_t |x_t diag(s) W0 + b - y_t|^2 / |y_t|^2 + lam |s - 1|^2, written out over vec(Y)."""
    n, d = x.shape
    out = w0.shape[1]
    scale = (1 / y.norm(dim=1)).repeat_interleave(out)  # vec(Y) is token-major: each token's outputs together
    columns = [(x[:, j, None] * w0[j]).reshape(-1) * scale for j in range(d)]  # vec of X_j W0[j, :], weighted
    energy = torch.stack([c @ c for c in columns])  # diag of the s-block of the normal equations
    lam = ridge * float(energy.mean())
    if b0 is not None:
        columns += [torch.eye(out, dtype=x.dtype)[o].repeat(n) * scale for o in range(out)]
    a = torch.stack(columns, 1)
    rows = torch.cat([torch.eye(d, dtype=x.dtype), torch.zeros(d, a.shape[1] - d, dtype=x.dtype)], 1) * lam**0.5
    target = torch.cat([y.reshape(-1) * scale, torch.full((d,), lam**0.5, dtype=x.dtype)])
    solved = torch.linalg.lstsq(torch.cat([a, rows]), target[:, None], driver="gelsd").solution[:, 0]
    return w0 * solved[:d, None], (solved[d:] if b0 is not None else None)


@pytest.mark.parametrize(
    ("family", "fit", "drop"),
    [
        ("gpt2", "full", []),
        ("gpt2", "diag", [1]),
        ("llama-gqa", "full", [1]),
        ("llama-gqa", "diag", []),
        ("bert", "full", []),
    ],
)
def test_the_refit_solves_the_least_squares_problem_it_states(family, fit, drop):
    """Every cut layer's down projection solves its ridge problem on X = the kept neurons'
    activations in the compensated, gated model (earlier layers and the block's own heads
    already compensated) and Y = the unpruned model's down-projection output plus its residual
    stream there, less the compensated model's, each token's error relative to its |Y_t|."""
    base = TINY[family]()
    heads = {l: h for l, h in HEADS.get(family, DEFAULT_HEADS).items() if l not in drop}
    remove_ffn = {l: n for l, n in half_of_every_ffn(base).items() if l not in drop}
    data = calibration(family)
    got = copy.deepcopy(base)
    result = compensate(got, heads, drop, data, remove_ffn=remove_ffn, ffn_fit=fit)
    assert result.ffn_layers == sorted(remove_ffn)
    solve = _ridge_lstsq if fit == "full" else _ridge_diag
    for layer, removed in remove_ffn.items():
        x, residual = _down_inputs(got, layer, data, heads, remove_ffn, drop)
        y = _down_outputs(base, layer, data) - residual
        kept = [n for n in range(info_of(base).layout.num_ffn[layer]) if n not in set(removed)]
        w, b = _in_out(down(base, layer))
        want_w, want_b = solve(x[:, kept], y, w[kept], b, ridge=0.1)
        got_w, got_b = _in_out(down(got, layer))
        torch.testing.assert_close(got_w[kept], want_w, rtol=2e-4, atol=2e-5, msg=f"layer {layer}")
        assert torch.equal(got_w[removed], w[removed])  # the removed columns are left for the cut
        if b is not None:
            torch.testing.assert_close(got_b, want_b, rtol=2e-4, atol=2e-5, msg=f"layer {layer}")


def _in_out(module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weight as [in, out] (Conv1D stores it so, Linear transposed) and bias, float64."""
    w = module.weight.detach().double()
    b = module.bias.detach().double() if module.bias is not None else None
    return (w if is_conv1d(module) else w.T), b


def _real(x: torch.Tensor, batch: dict) -> torch.Tensor:
    mask = batch.get("attention_mask")
    return x[mask.bool()].double() if mask is not None else x.reshape(-1, x.shape[-1]).double()


def _down_inputs(model, layer: int, data, heads, remove_ffn, drop) -> tuple[torch.Tensor, torch.Tensor]:
    """The down projection's input and the residual stream it adds to, in the gated model."""
    with (
        HeadGates(model, removal_gates(model, heads)),
        NeuronGates(model, removal_ffn_gates(model, remove_ffn)),
        skip_layers(model, drop),
    ):
        return _inputs(model, layer, data)


def _down_outputs(model, layer: int, data) -> torch.Tensor:
    """The down projection's output plus the residual stream it is added to."""
    x, residual = _inputs(model, layer, data)
    w, b = _in_out(down(model, layer))
    return x @ w + (b if b is not None else 0) + residual


def _inputs(model, layer: int, data) -> tuple[torch.Tensor, torch.Tensor]:
    """On every batch's real tokens: the input of `layer`'s down projection, and the input of the
    adapter's residual_input module for its FFN (the hidden states, positional or by keyword)."""
    xs, residuals = [], []
    adapter = adapter_for(model)
    stream = adapter.residual_input(adapter.layer_list(model)[layer], "ffn")
    hooks = [
        down(model, layer).register_forward_pre_hook(lambda m, args: xs.append(args[0].detach())),
        stream.register_forward_pre_hook(
            lambda m, args, kw: residuals.append(hidden_states_in(args, kw).detach()), with_kwargs=True
        ),
    ]
    with torch.no_grad():
        for batch in data:
            model(**batch)
    for hook in hooks:
        hook.remove()
    real = [torch.cat([_real(t, b) for t, b in zip(ts, data)]) for ts in (xs, residuals)]
    return real[0], real[1]


def _deep_llama(layers: int):
    import transformers as T

    torch.manual_seed(0)
    config = T.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=48,
        pad_token_id=0,
    )
    return T.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("layers", [3, 8])
def test_heads_and_ffn_of_every_layer_take_one_pass_over_the_depth(layers):
    model = _deep_llama(layers)
    data = calibration("llama", n_batches=2)
    counts = {"block": 0, "model": 0}
    blocks = adapter_for(model).layer_list(model)
    hooks = [b.register_forward_hook(lambda m, *_: count_computed(counts, m)) for b in blocks]
    hooks.append(model.register_forward_pre_hook(lambda *_: counts.__setitem__("model", counts["model"] + 1)))
    result = compensate(
        model, {l: [1] for l in range(layers)}, [], data, remove_ffn={l: [0, 5, 7] for l in range(layers)}
    )
    for h in hooks:
        h.remove()
    assert result.layers == result.ffn_layers == list(range(layers))
    # Completed block forwards per batch: the recording forward computes block 0 only, then per
    # block the unpruned stream and the pruned stream through the new weights (the unpruned run
    # for the heads' statistics and both pruned runs for the statistics stop at the projection).
    assert counts["block"] == (1 + 2 * layers) * len(data)
    assert counts["model"] == len(data)


def test_a_bfloat16_model_is_gated_and_refit_in_its_own_dtype():
    model = TINY["llama-gqa"]().to(torch.bfloat16)
    remove_ffn = half_of_every_ffn(model)
    result = compensate(model, HEADS["llama-gqa"], [], calibration("llama-gqa"), remove_ffn=remove_ffn)
    assert result.ffn_layers == [0, 1, 2]
    assert all(result.ffn_error_after[l] < result.ffn_error_before[l] for l in result.ffn_layers)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_a_second_cut_of_an_already_cut_ffn_speaks_in_original_neuron_indices():
    model = TINY["gpt2"]()
    first = {0: list(range(0, 128, 4)), 2: list(range(64))}  # original indices
    apply_plan(model, {}, [], remove_ffn=first)
    second = {0: [1, 2, 5, 126], 2: [64, 100, 127]}  # original indices still kept after the first cut
    result = compensate(model, {}, [], calibration("gpt2"), remove_ffn=second)
    assert result.ffn_layers == [0, 2]
    assert all(result.ffn_error_after[l] < result.ffn_error_before[l] for l in result.ffn_layers)
    inputs = model_inputs("gpt2")
    with torch.no_grad(), NeuronGates(model, removal_ffn_gates(model, second)):
        gated = model_output(model, inputs)
    apply_plan(model, {}, [], remove_ffn=second)
    torch.testing.assert_close(model_output(model, inputs), gated, rtol=1e-4, atol=1e-5)
    layout = info_of(model).layout
    assert layout.kept_neurons(2) == [n for n in range(64, 128) if n not in (64, 100, 127)]


def test_a_bad_remove_ffn_is_refused_before_any_compute():
    from headprune_cli.errors import PlanError

    model = TINY["bert"]()
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    with pytest.raises(PlanError, match="not in the model"):
        compensate(model, {0: [1]}, [], calibration("bert"), remove_ffn={1: [48]})
    with pytest.raises(PlanError, match="also in remove_layers"):
        compensate(model, {0: [1]}, [1], calibration("bert"), remove_ffn={1: [3]})
    hook.remove()
    assert calls == []
