"""`headprune import FILE.gguf`: what is refused before any tensor is dequantized."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from headprune_cli.errors import EXIT_ERROR
from headprune_cli.model.gguf_import import gguf_source, header
from tests.support import assert_refused

gguf = pytest.importorskip("gguf")


def _write_gguf(path: Path, arch: str, claimed_blocks: int = 1, claimed_width: int = 32) -> Path:
    """A header and two tensors (one block): as small as a GGUF gets, its header's shape stated."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_block_count(claimed_blocks)
    writer.add_embedding_length(claimed_width)
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_header_names_architecture_and_quantization(tmp_path: Path) -> None:
    meta = header(_write_gguf(tmp_path / "m.gguf", "llama"))
    assert meta == {"architecture": "llama", "quantization": "Q8_0", "tensor_types": {"F32": 2}}


def test_an_architecture_headprune_does_not_cut_is_one_line(tmp_path: Path, cli) -> None:
    source = _write_gguf(tmp_path / "mamba.gguf", "mamba")
    result = cli("import", source, "-o", tmp_path / "out.safetensors")
    assert_refused(result, EXIT_ERROR, "GGUF architecture 'mamba' is not one headprune cuts")
    assert not (tmp_path / "out.safetensors").exists()


def test_a_file_that_is_not_gguf_is_one_line(tmp_path: Path, cli) -> None:
    source = tmp_path / "broken.gguf"
    source.write_bytes(b"GGUF" + b"\x00" * 5)
    result = cli("import", source, "-o", tmp_path / "out.safetensors")
    assert_refused(result, EXIT_ERROR, "not a readable GGUF file")
    assert not (tmp_path / "out.safetensors").exists()


def test_which_gguf_a_source_names(tmp_path: Path) -> None:
    one = _write_gguf(tmp_path / "a.gguf", "llama")
    assert gguf_source(one) == one and gguf_source(tmp_path) == one
    (tmp_path / "config.json").write_text("{}")
    assert gguf_source(tmp_path) is None  # a Hugging Face folder imports as one
    (tmp_path / "config.json").unlink()
    _write_gguf(tmp_path / "b.gguf", "llama")
    with pytest.raises(Exception, match="holds 2 GGUF files"):
        gguf_source(tmp_path)


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ({"claimed_blocks": 30000}, "its header states 30000 blocks, its tensors hold 1"),
        ({"claimed_width": 4096}, "its embedding width (32) is not the header's (4096)"),
    ],
)
def test_a_header_that_is_not_its_tensors_shape_is_refused_before_a_model_is_built(tmp_path, cli, claims, message):
    """A 1 KB file claiming 30,000 blocks made transformers build (and print a progress bar for) a
    model that large before failing; the header is checked against the tensors first."""
    source = _write_gguf(tmp_path / "bomb.gguf", "llama", **claims)
    result = cli("import", source, "-o", tmp_path / "out.safetensors")
    assert_refused(result, EXIT_ERROR, message)
    assert not (tmp_path / "out.safetensors").exists()


def test_a_fifo_is_named_as_what_it_is(tmp_path, cli):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    result = cli("import", fifo, "-o", tmp_path / "out.safetensors")
    assert_refused(result, EXIT_ERROR, "not a regular file or a folder")
    assert not (tmp_path / "out.safetensors").exists()


def test_a_checkpoint_imported_with_transformers_gguf_mark_loads_and_exports_without_it(tmp_path: Path) -> None:
    """Imports before 2026-12-04 kept transformers' `quantization_config` of a GGUF read; such a
    checkpoint's tensors are floats all the same, so it loads unmarked and its folder names no .gguf."""
    import json

    from headprune_cli import load, save
    from headprune_cli.cli import main
    from headprune_cli.model.layout import info_of
    from tests.support import TINY

    model = TINY["llama-gqa"]()
    model.config.quantization_config = {"quant_method": "gguf", "gguf_file": "x.Q4_1.gguf", "dequantize": False}
    save(model, tmp_path / "old.safetensors")
    assert "quantization_config" not in info_of(load(tmp_path / "old.safetensors")).config
    assert main(["export", str(tmp_path / "old.safetensors"), "--hf", str(tmp_path / "hf")]) == 0
    assert "quantization_config" not in json.loads((tmp_path / "hf" / "config.json").read_text())
