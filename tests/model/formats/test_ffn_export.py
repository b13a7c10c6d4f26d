"""FFN-pruned models out of headprune: one FFN width in every layer exports as a plain
transformers folder (smaller intermediate_size) that loads with no headprune importable
and gives headprune's logits; uneven widths are kept from transformers with a note that
names the remedy; ONNX serves uneven widths."""

import json

import numpy as np
import pytest
import torch
import transformers as T
from safetensors.torch import load_file, save_file

import headprune_cli
from headprune_cli.model.formats.hf import export_hf
from headprune_cli.model.formats.hf_config import folder_config
from headprune_cli.model.formats.onnx import export_onnx
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import apply_plan
from tests.support import TINY, model_inputs, model_output, run_without_headprune

# Loads every folder named on the command line with its own transformers class (fp32),
# runs the inputs saved for it and writes the output.
LOAD_PLAIN = """
import json
import torch
import transformers
from safetensors.torch import load_file, save_file

out = {}
for folder in sys.argv[1:]:
    arch = json.load(open(folder + "/config.json"))["architectures"][0]
    model = getattr(transformers, arch).from_pretrained(folder, dtype=torch.float32)
    model.eval()
    inputs = load_file(folder + ".inputs.safetensors")
    with torch.no_grad():
        result = model(**inputs)
    value = result.logits if getattr(result, "logits", None) is not None else result.last_hidden_state
    out[folder] = value.contiguous()
    config = model.config.to_dict()
    width = config.get("intermediate_size") or config.get("n_inner") or config.get("hidden_dim")
    out[folder + ".width"] = torch.tensor(width)
save_file(out, "outputs.safetensors")
"""

# Uniform plans: every layer keeps the same FFN width; heads cut uniformly where a config
# can state it (LLaMA family), layer 1 dropped.
UNIFORM = {
    "bert": ({}, 10),
    "roberta": ({}, 7),
    "distilbert": ({}, 12),
    "gpt2": ({}, 40),
    "llama-gqa": ({0: [0, 1, 2, 3], 2: [4, 5, 6, 7]}, 16),
    "qwen3": ({0: [4, 5, 6, 7], 2: [0, 1, 2, 3]}, 9),
    "mistral": ({}, 5),
    "vit": ({}, 8),
}


def _uniform(family: str):
    heads, cut = UNIFORM[family]
    model = TINY[family]()
    layout = info_of(model).layout
    # different neurons per layer, the same count: layer 0 loses its first, layer 2 its last
    neurons = {0: list(range(cut)), 2: list(range(layout.num_ffn[2] - cut, layout.num_ffn[2]))}
    return apply_plan(model, heads, [1], neurons), layout.num_ffn[0] - cut


def test_uniform_ffn_widths_export_as_plain_transformers_folders(tmp_path):
    names = []
    for family in sorted(UNIFORM):
        model, width = _uniform(family)
        folder = export_hf(model, tmp_path / family)
        assert (folder / "model.safetensors").is_file() and folder_config(info_of(model)).plain
        save_file(model_inputs(family), tmp_path / f"{family}.inputs.safetensors")
        names.append(family)
    run_without_headprune(LOAD_PLAIN, tmp_path, *names)
    got = load_file(tmp_path / "outputs.safetensors")
    for family in names:
        _, width = _uniform(family)
        assert int(got[family + ".width"]) == width, family
        with torch.no_grad():
            want = model_output(headprune_cli.load(tmp_path / family), model_inputs(family))
        torch.testing.assert_close(got[family], want, atol=1e-5, rtol=0, msg=family)


UNEVEN = {
    "llama-gqa": ({0: [1, 2, 3]}, True),  # uniform heads, FFN 45 / 48 / 48
    "bert": ({2: [0, 7]}, True),
    "gpt2": ({1: list(range(30))}, True),
    "reference": ({1: [0]}, False),  # transformers does not know the class at all
}


@pytest.mark.parametrize("family", sorted(UNEVEN))
def test_uneven_ffn_widths_are_kept_from_transformers_with_the_remedy(tmp_path, cli, family):
    neurons, uniform_helps = UNEVEN[family]
    model = apply_plan(TINY[family](), {}, [], neurons)
    headprune_cli.save(model, tmp_path / "m.safetensors")
    res = cli("export", tmp_path / "m.safetensors", "--hf", tmp_path / "out")
    assert res.code == 0, res.err
    note = [line for line in res.err.splitlines() if line.startswith("note:")]
    assert len(note) == 1 and "--with-onnx" in note[0]
    assert ("--uniform" in note[0]) == uniform_helps and ("different FFN widths" in note[0]) == uniform_helps
    folder = tmp_path / "out"
    assert not (folder / "model.safetensors").exists() and (folder / "headprune.safetensors").is_file()
    config = json.loads((folder / "config.json").read_text())
    assert config.get("intermediate_size", 48) == 48 and config.get("n_inner") is None  # the unpruned widths
    if family != "reference":
        auto = getattr(T, info_of(model).architecture)
        with pytest.raises(OSError, match="no file named model.safetensors"):
            auto.from_pretrained(str(folder), ignore_mismatched_sizes=True)
    back = headprune_cli.load(folder)
    assert info_of(back).layout == info_of(model).layout
    assert torch.equal(model_output(back, model_inputs(family)), model_output(model, model_inputs(family)))


@pytest.mark.parametrize("family", ["bert", "llama-gqa"])
def test_onnx_serves_per_layer_ffn_widths(tmp_path, family):
    import onnxruntime as ort

    model = apply_plan(TINY[family](), {}, [1], {0: list(range(0, 48, 2)), 2: [3, 4, 5]})
    result = export_onnx(model, tmp_path / "m.onnx", seq_len=9)
    assert result.max_abs_diff <= 1e-4
    if family == "bert":
        session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
        inputs = model_inputs(family, batch=3, seq=11)
        (got,) = session.run(None, {k: v.numpy() for k, v in inputs.items()})
        np.testing.assert_allclose(got, model_output(model, inputs).numpy(), atol=1e-4, rtol=0)


def test_a_head_count_llama_config_refuses_is_not_written_as_plain(tmp_path):
    # LlamaConfig insists on hidden_size % num_attention_heads == 0 even with head_dim given:
    # 3 of 4 heads at hidden 32 would write a config.json that from_pretrained cannot read
    model = apply_plan(TINY["llama"](), {0: [1], 1: [1], 2: [1]}, [], {0: [0], 1: [0], 2: [0]})
    layout = folder_config(info_of(model))
    assert (
        not layout.plain
        and "refuses the pruned counts" in layout.reason
        and "multiple of the number of attention heads" in layout.reason
    )
    folder = export_hf(model, tmp_path / "out")
    assert not (folder / "model.safetensors").exists()
    assert json.loads((folder / "config.json").read_text())["num_attention_heads"] == 4  # the unpruned counts
    with pytest.raises(OSError, match="no file named model.safetensors"):
        T.LlamaForCausalLM.from_pretrained(str(folder))
    assert torch.equal(
        model_output(headprune_cli.load(folder), model_inputs("llama")), model_output(model, model_inputs("llama"))
    )
