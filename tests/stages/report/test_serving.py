"""Serving a causal LM: KV-cache bytes per token, prefill/decode predictions, decode in the report.

The KV-cache figure is checked against the cache transformers really fills; the prefill
and decode FLOPs against hooks on a real forward; the report's decode section for its
fields and settings (never for timings).
"""

from __future__ import annotations

import json

import pytest
import torch

from headprune_cli import load, save
from headprune_cli.artifacts.schema import read_artifact
from headprune_cli.model.cost import decode_cost, kv_cache_bytes, prefill_flops, weight_bytes
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import apply_plan
from headprune_cli.stages.model_latency import cache_name
from tests.support import CAUSAL, ROOT, TINY, VOCAB, counted_macs, give_tokenizer, write_text

FAST = ("--seq-len", "16", "--repeats", "2", "--warmup", "0", "--batch-size", "4")


def _one_group_per_layer(model) -> dict[int, list[int]]:
    """Remove KV group 0 (its query heads) of every layer: half of the groups of a 2-group model."""
    layout = info_of(model).layout
    return {layer: list(range(layout.num_heads[layer] // layout.num_kv_heads[layer])) for layer in layout.layers}


def _cache_bytes_per_token(model, prompt: int = 5) -> float:
    """Bytes of the keys and values transformers' own cache holds, per prompt token."""
    ids = torch.randint(2, VOCAB, (1, prompt), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = getattr(model(input_ids=ids, use_cache=True), cache_name(model))
    tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    return sum(t.numel() * t.element_size() for t in tensors) / prompt


@pytest.mark.parametrize("name", ["llama-gqa", "qwen3", "mistral"])
def test_kv_bytes_per_token_are_exact_and_shrink_by_the_removed_fraction_of_kv_groups(name):
    model = TINY[name]()
    view = info_of(model).layout
    before = kv_cache_bytes(model)
    head_dim = model.config.head_dim
    assert before["per_layer"] == {layer: view.num_kv_heads[layer] * head_dim * 2 * 4 for layer in view.layers}
    assert before["total"] == _cache_bytes_per_token(model) and before["dtype"] == "float32"
    apply_plan(model, _one_group_per_layer(model), [])
    after = kv_cache_bytes(model)
    assert after["total"] == _cache_bytes_per_token(model)
    removed = 1 / model.config.num_key_value_heads  # one of the groups in every layer
    assert after["total"] / before["total"] == pytest.approx(1 - removed, abs=0)


def test_kv_bytes_follow_removed_layers_gpt2_heads_and_the_stored_dtype():
    gpt2 = TINY["gpt2"]()
    apply_plan(gpt2, {0: [0, 1]}, [1])  # GPT-2 caches every query head: no GQA
    kv = kv_cache_bytes(gpt2)
    assert kv["per_layer"] == {0: 2 * 8 * 2 * 4, 2: 4 * 8 * 2 * 4}
    assert kv["total"] == _cache_bytes_per_token(gpt2)
    half = TINY["llama-gqa"]().to(torch.bfloat16)
    kv = kv_cache_bytes(half)
    assert kv["dtype"] == "bfloat16" and kv["total"] == 3 * 2 * 4 * 2 * 2 == _cache_bytes_per_token(half)


@pytest.mark.parametrize("name", ["bert", "roberta", "vit", "reference"])
def test_encoders_have_no_kv_cache(name):
    assert kv_cache_bytes(TINY[name]()) is None


@pytest.mark.parametrize("name", CAUSAL)
def test_prefill_and_decode_flops_match_hooks_on_a_real_forward(name):
    model = TINY[name]()
    apply_plan(model, _one_group_per_layer(model), [1])
    prompt, tokens = 6, 3
    ids = torch.randint(2, VOCAB, (1, prompt), generator=torch.Generator().manual_seed(0))
    from headprune_cli.model.arch import adapter_for

    adapter = adapter_for(model)
    views = [adapter.attention(layer) for layer in adapter.layer_list(model)]
    score_macs = sum(2 * v.num_heads * v.head_dim for v in views)  # QK^T + AV per (query, key)
    prefill_macs = counted_macs(model, {"input_ids": ids, "logits_to_keep": 1})
    causal_pairs = prompt * (prompt + 1) / 2
    assert prefill_flops(model, prompt) == pytest.approx(2 * prefill_macs + 2 * score_macs * causal_pairs, rel=1e-9)
    one_step = counted_macs(model, {"input_ids": ids[:, :1]})  # one token: every linear once
    keys = prompt + (tokens + 1) / 2
    cost = decode_cost(model, prompt, tokens, batch=4)
    assert cost["flops_per_token"] == pytest.approx(2 * one_step + 2 * score_macs * keys, rel=1e-9)
    linear_bytes = {
        id(p): p.numel() * 4
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"
        for p in m.parameters(recurse=False)
    }
    assert weight_bytes(model) == cost["weight_bytes_per_step"] == sum(linear_bytes.values())
    kv = kv_cache_bytes(model)["total"]
    assert cost["bytes_per_token"] == pytest.approx(weight_bytes(model) / 4 + 3 * kv * keys)


# --- the report ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """A tiny GQA LLaMA and a copy without one of its two KV groups in every layer."""
    folder = tmp_path_factory.mktemp("serving")
    base = give_tokenizer(TINY["llama-gqa"](), encoder=False)
    save(base, folder / "base.safetensors")
    pruned = load(folder / "base.safetensors")
    apply_plan(pruned, _one_group_per_layer(pruned), [])
    save(pruned, folder / "pruned.safetensors")
    write_text(folder / "dev.txt", 8)
    return folder


def _report(cli, folder, *extra):
    return cli("report", "--model", folder / "pruned.safetensors", "--data", folder / "dev.txt", *FAST, *extra)


def test_report_states_kv_cache_and_measures_prefill_and_decode_beside_predictions(lm, cli, tmp_path):
    result = _report(
        cli,
        lm,
        "--decode-prompt",
        "12",
        "--decode-tokens",
        "3",
        "--decode-batch",
        "2",
        "--json",
        tmp_path / "r.json",
        "--markdown",
        tmp_path / "r.md",
    )
    assert result.code == 0, result.err
    report, _ = read_artifact(tmp_path / "r.json", ("report",))  # the schema accepts it
    data = json.loads((tmp_path / "r.json").read_text())
    kv = data["kv_cache"]
    assert kv["baseline"]["per_layer"] == {"0": 64, "1": 64, "2": 64} and kv["pruned"]["total"] == 96
    assert kv["ratio"] == 0.5 and kv["reduction"] == 0.5 and kv["dtype"] == "float32"
    decode = data["cost"]["decode"]
    assert (decode["batch"], decode["prompt"], decode["tokens"]) == (2, 12, 3)
    assert decode["predicted_decode_speedup"] > 1 and decode["predicted_prefill_speedup"] > 1
    assert decode["pruned"]["kv_bytes_per_token"] == pytest.approx(decode["baseline"]["kv_bytes_per_token"] / 2)
    measured = data["measured"]["decode"]
    assert (measured["batch"], measured["prompt"], measured["tokens"], measured["repeats"]) == (2, 12, 3, 2)
    for side in ("baseline", "pruned"):
        assert measured["prefill_ms"][side]["runs"] == measured["decode_ms"][side]["runs"] == 2
        tokens_per_s = 2 * 3 * 1000 / measured["decode_ms"][side]["median_ms"]
        assert measured["decode_tokens_per_s"][side] == pytest.approx(tokens_per_s)
    assert measured["decode_vs_predicted"] == pytest.approx(
        measured["decode_speedup"] / decode["predicted_decode_speedup"]
    )
    assert measured["prefill_vs_predicted"] == pytest.approx(
        measured["prefill_speedup"] / decode["predicted_prefill_speedup"]
    )
    markdown = (tmp_path / "r.md").read_text()
    assert "| KV cache per token (float32) | 192 B | 96 B | -50.0% |" in markdown
    assert (
        "| prefill ms, batch 2 x 12 tokens (IQR) |" in markdown and "| decode tokens/s, batch 2, 3 tokens |" in markdown
    )
    assert "KV cache per token 192 → 96 bytes (float32, -50.0%); prefill predicted" in result.err
    assert "decode predicted" in result.err and "measured" in result.err


def test_decode_defaults_fit_the_model_and_can_be_turned_off(lm, cli):
    result = _report(cli, lm, "--repeats", "0", "--json", "-")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert (data["cost"]["decode"]["prompt"], data["cost"]["decode"]["tokens"], data["cost"]["decode"]["batch"]) == (
        128,
        32,
        1,
    )
    assert data["measured"] is None  # --repeats 0 times nothing, decode included
    off = json.loads(_report(cli, lm, "--decode-tokens", "0", "--json", "-").out)
    assert off["cost"]["decode"] is None and off["measured"]["decode"] is None
    assert off["kv_cache"]["reduction"] == 0.5  # the KV cache is a fact of the layout, not a measurement


def test_the_default_prompt_shrinks_to_the_model_positions_and_an_explicit_one_is_refused(tmp_path, cli):
    base = TINY["llama-gqa"]()
    base.config.max_position_embeddings = 40
    info_of(base).config["max_position_embeddings"] = 40
    save(give_tokenizer(base, encoder=False), tmp_path / "base.safetensors")
    write_text(tmp_path / "dev.txt", 4)
    args = (
        "report",
        "--model",
        tmp_path / "base.safetensors",
        "--baseline",
        tmp_path / "base.safetensors",
        "--data",
        tmp_path / "dev.txt",
        "--seq-len",
        "16",
        "--repeats",
        "0",
        "--json",
        "-",
    )
    result = cli(*args)
    assert result.code == 0, result.err
    assert json.loads(result.out)["cost"]["decode"]["prompt"] == 40 - 32
    refused = cli(*args, "--decode-prompt", "20", "--decode-tokens", "21")
    assert refused.code == 2 and refused.err.startswith(
        "Error: --decode-prompt 20 + --decode-tokens 21 exceed the model's maximum of 40"
    )
    refused = cli(*args, "--decode-tokens", "40")
    assert refused.code == 2 and "leaves no room for a prompt" in refused.err


def test_an_encoder_report_says_kv_cache_n_a(cli, tmp_path):
    base = give_tokenizer(TINY["roberta"]())
    save(base, tmp_path / "base.safetensors")
    pruned = load(tmp_path / "base.safetensors")
    apply_plan(pruned, {0: [0, 1]}, [])
    save(pruned, tmp_path / "pruned.safetensors")
    write_text(tmp_path / "dev.txt", 8)
    result = cli(
        "report",
        "--model",
        tmp_path / "pruned.safetensors",
        "--data",
        tmp_path / "dev.txt",
        *FAST,
        "--json",
        tmp_path / "r.json",
        "--markdown",
        tmp_path / "r.md",
    )
    assert result.code == 0, result.err
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["kv_cache"] is None and data["cost"]["decode"] is None and data["measured"]["decode"] is None
    assert "KV cache: n/a" in result.err
    assert "| KV cache per token | n/a | n/a | encoder: no KV cache |" in (tmp_path / "r.md").read_text()


def test_reports_without_the_serving_fields_still_read_and_unknown_fields_are_refused(lm, cli, tmp_path):
    from headprune_cli.errors import ArtifactError

    data = json.loads(
        _report(cli, lm, "--repeats", "1", "--decode-tokens", "2", "--decode-prompt", "4", "--json", "-").out
    )
    older = json.loads(json.dumps(data))
    del older["kv_cache"], older["cost"]["decode"], older["measured"]["decode"]
    (tmp_path / "old.json").write_text(json.dumps(older))
    report, _ = read_artifact(tmp_path / "old.json", ("report",))
    assert report.kv_cache is None and report.cost.decode is None and report.measured.decode is None
    newer = json.loads(json.dumps(data))
    newer["measured"]["decode"]["energy_j"] = 1.0
    (tmp_path / "new.json").write_text(json.dumps(newer))
    with pytest.raises(ArtifactError, match="measured.decode.energy_j"):
        read_artifact(tmp_path / "new.json", ("report",))


def test_inspect_shows_kv_cache_per_layer_and_total(lm, cli):
    result = cli("inspect", lm / "pruned.safetensors", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["kv_cache"] == {
        "dtype": "float32",
        "per_layer": {"0": 32, "1": 32, "2": 32},
        "total": 96,
    }
    table = cli("inspect", lm / "pruned.safetensors")
    assert "KV cache: 96 bytes per token (float32)" in table.err and "KV cache B/token" in table.err
    encoder = cli("inspect", ROOT / "examples" / "demo" / "model.safetensors", "--json")
    assert json.loads(encoder.out)["kv_cache"] is None
