"""`headprune import FILE.gguf`: a llama.cpp model file -> float weights headprune can cut.

transformers reads the GGUF (`from_pretrained(folder, gguf_file=name)`): its header becomes
the config, each tensor is dequantized with gguf's own function for its type (Q4_1, Q4_K,
Q8_0, ...) to float32, and the tokenizer is rebuilt from the GGUF's vocabulary and merges.
No remote code runs: the architecture is read from the header and refused before any tensor
is touched when headprune does not cut it. Provenance names the GGUF (file name, sha256,
quantization type), so a checkpoint says which quantized file its float weights came from.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import transformers
from torch import nn

from headprune_cli.errors import ArchitectureError, CheckpointError, HeadpruneError, first_line
from headprune_cli.files.io import sha256_file
from headprune_cli.files.watcher import note_read
from headprune_cli.model.arch import adapter_for_model_type
from headprune_cli.model.layout import info_of

# general.architecture -> the transformers model_type its GGUF loader builds.
MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


def gguf_source(source: Path) -> Path | None:
    """The GGUF file to import: SOURCE itself (FILE.gguf), or the one *.gguf in a folder that
    holds no config.json (a package's data folder); None when SOURCE is neither."""
    if source.is_file():
        return source if source.suffix.lower() == ".gguf" else None
    if not source.is_dir() or (source / "config.json").is_file():
        return None
    found = sorted(p for p in source.glob("*.gguf") if p.is_file())
    if len(found) > 1:
        names = ", ".join(p.name for p in found[:4])
        raise CheckpointError(f"{source}: holds {len(found)} GGUF files ({names}); name the one to import")
    return found[0] if found else None


def header(path: Path) -> dict:
    """Architecture, quantization type and tensor types, from the memory-mapped header."""
    import gguf  # noqa: PLC0415 (an optional extra; only this import path needs it)

    try:
        reader = gguf.GGUFReader(str(path))
        arch = reader.fields["general.architecture"].contents()
        file_type = reader.fields.get("general.file_type")
        types = Counter(t.tensor_type.name for t in reader.tensors)
        _check_shape(path, reader, str(arch))
    except HeadpruneError:
        raise
    except Exception as exc:  # a truncated or foreign file: gguf raises whatever its parser hit
        raise CheckpointError(f"{path}: not a readable GGUF file ({first_line(exc)})") from None
    quant = _file_type_name(gguf, file_type.contents()) if file_type is not None else types.most_common(1)[0][0]
    return {"architecture": str(arch), "quantization": quant, "tensor_types": dict(sorted(types.items()))}


def _check_shape(path: Path, reader, arch: str) -> None:
    """The header's shape is the tensors' before transformers builds a model from it: the block
    count is the blocks the file holds, the embedding width the token embedding's (a 150 KB file
    that claims 30,000 blocks would otherwise make transformers allocate them first)."""
    field = reader.fields.get(f"{arch}.block_count")
    blocks = {int(t.name.split(".")[1]) for t in reader.tensors if t.name.startswith("blk.")}
    if field is None or int(field.contents()) != len(blocks) or blocks != set(range(len(blocks))):
        claimed = "no" if field is None else int(field.contents())
        raise CheckpointError(f"{path}: its header states {claimed} blocks, its tensors hold {len(blocks)}")
    width = reader.fields.get(f"{arch}.embedding_length")
    embedding = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if width is None or embedding is None or int(embedding.shape[0]) != int(width.contents()):
        found = "none" if embedding is None else int(embedding.shape[0])
        raise CheckpointError(
            f"{path}: its embedding width ({found}) is not the header's ({width and width.contents()})"
        )


def _file_type_name(gguf, value) -> str:
    try:
        return gguf.LlamaFileType(int(value)).name.removeprefix("MOSTLY_")
    except ValueError:
        return f"file_type {value}"


def import_gguf(path: Path) -> nn.Module:
    meta = header(path)
    model_type = MODEL_TYPES.get(meta["architecture"])
    if model_type is None:
        raise ArchitectureError(
            f"{path}: GGUF architecture {meta['architecture']!r} is not one headprune cuts "
            f"(supported: {', '.join(sorted(MODEL_TYPES))})"
        )
    adapter_for_model_type(model_type)
    note_read(path)
    digest = sha256_file(path)
    model = _load_model(path)
    info = info_of(model)
    info.tokenizer, info.tokenizer_config = _tokenizer(path)
    info.provenance["source"] = {
        "format": "gguf",
        "file": path.name,
        "sha256": digest,
        "architecture": meta["architecture"],
        "quantization": meta["quantization"],
        "tensor_types": meta["tensor_types"],
    }
    return model


def _load_model(path: Path) -> nn.Module:
    try:
        with _no_progress_bars():
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(path.parent),
                gguf_file=path.name,
                local_files_only=True,
                trust_remote_code=False,
                dtype=torch.float32,
            )
    except HeadpruneError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{path}: transformers could not dequantize this GGUF ({first_line(exc)})") from None
    # The weights are floats now, but transformers still marks the model GGUF-quantized: an
    # exported folder would repeat that (naming a .gguf it does not hold), and save_pretrained
    # refuses a quantized model. The provenance keeps the GGUF's name, hash and type.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    model.eval()
    return model


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers' bars off while it reads the GGUF: they would print before a refusal's one
    line, and the stage has its own output. Its GGUF reader draws a tqdm bar of its own
    ("Converting and de-quantizing GGUF tensors") that its progress-bar switch does not reach."""
    from transformers import modeling_gguf_pytorch_utils as reader  # noqa: PLC0415 (only the GGUF import reads it)

    was_enabled = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    drawn = getattr(reader, "tqdm", None)  # None: a transformers that no longer draws it
    if drawn is not None:
        reader.tqdm = functools.partial(drawn, disable=True)
    try:
        yield
    finally:
        if drawn is not None:
            reader.tqdm = drawn
        # Only if it was on: re-enabling under HF_HUB_DISABLE_PROGRESS_BARS (the CLI sets it) warns.
        if was_enabled:
            transformers.utils.logging.enable_progress_bar()


def _tokenizer(path: Path) -> tuple[str | None, dict]:
    """tokenizer.json text and the special tokens, rebuilt from the GGUF's vocabulary."""
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path}: no tokenizer could be built from its metadata ({first_line(exc)})") from None
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise CheckpointError(f"{path}: its tokenizer has no fast (tokenizer.json) form")
    special = {key: getattr(tok, key) for key in _TOKENS if isinstance(getattr(tok, key, None), str)}
    if isinstance(tok.model_max_length, int) and tok.model_max_length < 1 << 30:
        special["model_max_length"] = tok.model_max_length
    return backend.to_str(), special
