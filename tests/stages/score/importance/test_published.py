"""The published LLM pruning criteria (flap, wanda-sp, minitron, llm-pruner) compute what their
papers define, checked against a direct computation from the model's own tensors."""

from __future__ import annotations

import math

import pytest
import torch

from headprune_cli.data.readers import read_data
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import is_conv1d
from headprune_cli.stages.score.importance import score_model
from headprune_cli.stages.score.importance.context import ScoreContext
from headprune_cli.stages.score.importance.gradients import batch_losses
from tests.support import TINY, give_tokenizer, write_text


def _setup(tmp_path, name):
    model = give_tokenizer(TINY[name](), encoder=False).double()
    return model, read_data(write_text(tmp_path / "d.txt", 10), model)


def _inputs(model, data):
    """Every real token's input to each layer's output and down projection: [tokens, channels] each."""
    adapter = adapter_for(model)
    blocks = adapter.layer_list(model)
    seen: dict[tuple[str, int], torch.Tensor] = {}
    real = data.attention_mask.bool()

    def keep(key):
        return lambda module, args: seen.__setitem__(key, args[0].detach()[real])

    handles = [adapter.attention(b).o.register_forward_pre_hook(keep(("o", i))) for i, b in enumerate(blocks)]
    handles += [adapter.ffn(b).down.register_forward_pre_hook(keep(("down", i))) for i, b in enumerate(blocks)]
    with torch.no_grad():
        model(input_ids=data.input_ids, attention_mask=data.attention_mask)
    for handle in handles:
        handle.remove()
    return adapter, blocks, seen


def _weight(module) -> torch.Tensor:
    w = module.weight.detach().double()
    return w.T if is_conv1d(module) else w  # [out, in]


def _per_example(x_tokens: torch.Tensor, data, width: int) -> torch.Tensor:
    """[examples, width]: the per-token values regrouped by example (mean over its real tokens)."""
    counts = data.attention_mask.sum(1).tolist()
    return torch.stack([part.mean(0) for part in x_tokens.split(counts)])


@pytest.mark.parametrize("name", ["llama-gqa", "gpt2"])
def test_channel_methods_match_their_formulas(tmp_path, name):
    model, data = _setup(tmp_path, name)
    scored = {m: score_model(model, data, m, batch_size=3, ffn=True) for m in ("flap", "wanda-sp", "minitron")}
    adapter, blocks, seen = _inputs(model, data)
    for layer, block in enumerate(blocks):
        view, ffn = adapter.attention(block), adapter.ffn(block)
        x_o, x_d = seen[("o", layer)], seen[("down", layer)]
        w_o, w_d = _weight(view.o), _weight(ffn.down)
        # Wanda-sp: mean over rows of |W| * ||x_j||, summed over a head's channels.
        wanda_o = (w_o.abs() * x_o.norm(dim=0)).mean(0).reshape(-1, view.head_dim).sum(1)
        wanda_d = (w_d.abs() * x_d.norm(dim=0)).mean(0)
        assert list(scored["wanda-sp"].heads[layer].values()) == pytest.approx(wanda_o.tolist(), rel=1e-9)
        assert scored["wanda-sp"].ffn[layer] == pytest.approx(wanda_d.tolist(), rel=1e-9)
        # FLAP: (var * ||W_j||^2)^2 for attention, var * ||W_j||^2 for the FFN, standardised per layer.
        z = lambda m: (m - m.mean()) / m.std()  # noqa: E731
        flap_o = z((x_o.var(dim=0) * w_o.pow(2).sum(0)) ** 2).reshape(-1, view.head_dim).mean(1)
        flap_d = z(x_d.var(dim=0) * w_d.pow(2).sum(0))
        hidden = w_o.shape[0]
        head_price = view.head_dim * hidden * (2 + 2 / view.group_size)
        neuron_price = hidden * (len(ffn.ups) + 1)
        got_o = [math.log(s / head_price) for s in scored["flap"].heads[layer].values()]
        got_d = [math.log(s / neuron_price) for s in scored["flap"].ffn[layer]]
        assert got_o == pytest.approx(flap_o.tolist(), abs=1e-9)
        assert got_d == pytest.approx(flap_d.tolist(), abs=1e-9)
        # Minitron: mean over the sequence of ||o_h|| (|x_j|), then L2 over examples.
        heads = _per_example(x_o.reshape(len(x_o), -1, view.head_dim).norm(dim=-1), data, view.num_heads)
        neurons = _per_example(x_d.abs(), data, x_d.shape[1])
        assert list(scored["minitron"].heads[layer].values()) == pytest.approx(heads.norm(dim=0).tolist(), rel=1e-9)
        assert scored["minitron"].ffn[layer] == pytest.approx(neurons.norm(dim=0).tolist(), rel=1e-9)


def test_flap_scores_per_parameter_are_positive(tmp_path):
    """The budget greedy removes the least score per parameter first; exp(z) > 0 keeps that FLAP's z order."""
    model, data = _setup(tmp_path, "llama")
    result = score_model(model, data, "flap", batch_size=4, ffn=True)
    adapter = adapter_for(model)
    view = adapter.attention(adapter.layer_list(model)[0])
    head_price = view.head_dim * 32 * 4
    per_param = [s / head_price for layer in result.heads.values() for s in layer.values()]
    per_param += [s / (32 * 3) for layer in result.ffn.values() for s in layer]
    assert all(v > 0 for v in per_param)  # exp(z): positive, so greedy ratios keep their order


@pytest.mark.parametrize("name", ["llama-gqa", "llama"])
def test_llm_pruner_sums_first_order_terms_over_each_coupled_structure(tmp_path, name):
    model, data = _setup(tmp_path, name)
    result = score_model(model, data, "llm-pruner", batch_size=3, ffn=True)
    adapter = adapter_for(model)
    blocks = adapter.layer_list(model)
    views, ffns = [adapter.attention(b) for b in blocks], [adapter.ffn(b) for b in blocks]
    mods = [m for v, f in zip(views, ffns) for m in (v.q, v.k, v.v, v.o, *f.ups, f.down)]
    ctx = ScoreContext(model, data, "causal-lm", batch_size=len(data))
    batch = {"input_ids": data.input_ids, "attention_mask": data.attention_mask}
    grads = torch.autograd.grad(batch_losses(ctx, batch, 0).sum(), [m.weight for m in mods])
    term = {id(m): (g * m.weight.detach()).abs() for m, g in zip(mods, grads)}
    for layer, (view, ffn) in enumerate(zip(views, ffns)):
        d, g = view.head_dim, view.group_size
        for h in range(view.num_heads):
            rows, kv = slice(h * d, (h + 1) * d), slice((h // g) * d, (h // g + 1) * d)
            expected = term[id(view.q)][rows].sum() + term[id(view.o)][:, rows].sum()
            expected += (term[id(view.k)][kv].sum() + term[id(view.v)][kv].sum()) / g
            assert result.heads[layer][h] == pytest.approx(float(expected), rel=1e-9)
        neurons = sum(term[id(up)].sum(1) for up in ffn.ups) + term[id(ffn.down)].sum(0)
        assert result.ffn[layer] == pytest.approx(neurons.tolist(), rel=1e-9)


def test_llm_pruner_scores_fused_projections(tmp_path):
    model, data = _setup(tmp_path, "gpt2")
    first = score_model(model, data, "llm-pruner", batch_size=4, ffn=True)
    again = score_model(model, data, "llm-pruner", batch_size=4, ffn=True)
    assert first.heads == again.heads and first.ffn == again.ffn
    assert all(len(h) == 4 and all(v > 0 for v in h.values()) for h in first.heads.values())
