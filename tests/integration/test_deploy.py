"""Exports that serve without headprune: a uniform LLaMA/Qwen3 folder in plain
transformers (same outputs as headprune_cli.load, KV cache smaller by the removed share),
and layouts no config can state kept from loading there with wrong shapes."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from safetensors.torch import load_file, save_file

import headprune_cli
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import apply_plan
from tests.support import TINY, run_without_headprune, saved_model, write_scores

# Loads every folder named on the command line with AutoModelForCausalLM (fp32), runs the
# prompt in inputs.safetensors with the KV cache on, and writes logits and cache bytes.
LOAD_PLAIN = """
import json
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

inputs = load_file("inputs.safetensors")
out = {}
for folder in sys.argv[1:]:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        result = model(**inputs, use_cache=True)
    cache = result.past_key_values.layers
    nbytes = sum(t.numel() * t.element_size() for layer in cache for t in (layer.keys, layer.values))
    out[folder + ".logits"] = result.logits.contiguous()
    out[folder + ".kv_bytes"] = torch.tensor(nbytes)  # for the prompt's tokens; same prompt for all
save_file(out, "outputs.safetensors")
"""


def prune_uniform(tmp_path, cli, family: str, extra=()) -> tuple:
    """score (random) -> select --uniform -> prune -> export --hf; baseline exported too."""
    model, model_path = saved_model(tmp_path, family, name=f"{family}.safetensors")
    scores = write_scores(tmp_path, model, model_path, name=f"{family}-scores.json")
    plan = tmp_path / f"{family}-plan.json"
    assert cli("select", scores, "--ratio", "0.5", "--uniform", *extra, "-o", plan).code == 0
    small = tmp_path / f"{family}-small.safetensors"
    assert cli("prune", "--plan", plan, "-o", small).code == 0
    folders = []
    for ckpt in (model_path, small):
        folder = tmp_path / ckpt.stem
        res = cli("export", ckpt, "--hf", folder)
        assert res.code == 0, res.err
        assert "transformers loads it as it is" in res.err
        folders.append(folder)
    return folders


def test_uniform_llama_and_qwen3_load_in_plain_transformers(tmp_path, cli):
    runs = {
        "llama-gqa": prune_uniform(tmp_path, cli, "llama-gqa"),
        "qwen3": prune_uniform(tmp_path, cli, "qwen3", extra=("--drop-layers", "1")),  # layer count changes too
    }
    gen = torch.Generator().manual_seed(0)
    inputs = {
        "input_ids": torch.randint(2, 60, (2, 9), generator=gen),
        "attention_mask": torch.ones(2, 9, dtype=torch.long),
    }
    inputs["attention_mask"][0, :2] = 0  # left padding, as batched generation has
    save_file(inputs, tmp_path / "inputs.safetensors")
    names = [folder.name for folders in runs.values() for folder in folders]
    run_without_headprune(LOAD_PLAIN, tmp_path, *names)
    got = load_file(tmp_path / "outputs.safetensors")
    for family, (base, small) in runs.items():
        config = json.loads((small / "config.json").read_text())
        layout = info_of(headprune_cli.load(small)).layout
        assert (config["num_attention_heads"], config["num_key_value_heads"]) == (
            len(layout.heads[0]),
            len(layout.kv_heads[0]),
        )
        assert config["head_dim"] == info_of(headprune_cli.load(base)).config.get("head_dim")
        for folder in (base, small):
            with torch.no_grad():
                want = headprune_cli.load(folder)(**inputs).logits
            torch.testing.assert_close(got[folder.name + ".logits"], want, atol=1e-5, rtol=0)
        # The KV cache per token shrinks by the share of KV heads removed (layers dropped included).
        kept_share = sum(map(len, layout.kv_heads)) / sum(layout.num_kv_heads)
        ratio = int(got[small.name + ".kv_bytes"]) / int(got[base.name + ".kv_bytes"])
        assert kept_share < 1 and ratio == kept_share, family


UNEVEN = {
    "llama-gqa": ({0: [0, 1, 2, 3], 2: [0, 4]}, [1]),  # layers keep 4 and 6 query heads
    "bert": ({0: [0, 2], 1: [0, 2], 2: [0, 2]}, []),  # uniform, but BERT's head size is hidden/heads
    "gpt2": ({1: [3]}, []),
}


@pytest.mark.parametrize("family", sorted(UNEVEN))
def test_layouts_no_config_states_are_refused_by_transformers(tmp_path, cli, family):
    model = apply_plan(TINY[family](), *UNEVEN[family])
    headprune_cli.save(model, tmp_path / "m.safetensors")
    res = cli("export", tmp_path / "m.safetensors", "--hf", tmp_path / "out")
    assert res.code == 0, res.err
    note = [line for line in res.err.splitlines() if line.startswith("note:")]
    assert len(note) == 1 and "--with-onnx" in note[0] and "headprune_cli.load" in note[0]
    assert ("--uniform" in note[0]) == (family == "llama-gqa")  # the option that would make it plain
    folder = tmp_path / "out"
    assert not (folder / "model.safetensors").exists() and (folder / "headprune.safetensors").is_file()
    auto = T.AutoModelForCausalLM if family != "bert" else T.AutoModelForSequenceClassification
    with pytest.raises(OSError, match="no file named model.safetensors"):
        auto.from_pretrained(str(folder), ignore_mismatched_sizes=True)
    back = headprune_cli.load(folder)  # headprune itself still loads it exactly
    assert info_of(back).layout == info_of(model).layout


def test_unpruned_heads_with_dropped_layers_stay_plain(tmp_path):
    """Dropping whole layers is expressible for every transformers family."""
    from headprune_cli.model.formats.hf import export_hf

    for family in ("bert", "gpt2", "mistral"):
        model = apply_plan(TINY[family](), {}, [1])
        folder = export_hf(model, tmp_path / family)
        loaded = T.AutoConfig.from_pretrained(str(folder))
        assert loaded.num_hidden_layers == 2 and (folder / "model.safetensors").is_file()


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_other_llama_family_configs_state_uniform_layouts(tmp_path, family):
    """The subprocess test covers LLaMA-GQA and Qwen3; here the remaining config classes
    (Qwen2's config has no head_dim field of its own, Mistral's does)."""
    from headprune_cli.model.formats.hf import export_hf

    model = apply_plan(TINY[family](), {0: [0, 1], 1: [2, 3], 2: [0, 1]}, [])
    folder = export_hf(model, tmp_path / family)
    plain = T.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    ids = torch.randint(2, 60, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, headprune_cli.load(folder)(ids).logits, atol=1e-5, rtol=0)
    assert plain.config.num_attention_heads == 2


def test_with_onnx_writes_the_serving_graph_into_the_folder(tmp_path, cli):
    import onnxruntime as ort

    model = apply_plan(TINY["bert"](), *UNEVEN["bert"])
    headprune_cli.save(model, tmp_path / "m.safetensors")
    res = cli("export", tmp_path / "m.safetensors", "--hf", tmp_path / "out", "--with-onnx")
    assert res.code == 0, res.err
    assert "onnx/model.onnx (written) serves it" in res.err
    session = ort.InferenceSession(str(tmp_path / "out" / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = torch.randint(2, 60, (1, 5))
    (logits,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": torch.ones_like(ids).numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(logits), model(ids).logits, atol=1e-4, rtol=0)
    res = cli("export", tmp_path / "m.safetensors", "--onnx", tmp_path / "x.onnx", "--with-onnx")
    assert res.code == 2 and res.err.startswith("Error: --with-onnx") and not (tmp_path / "x.onnx").exists()
