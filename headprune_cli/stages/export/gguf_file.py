"""`export --gguf FILE`: the export stage's GGUF branch (the writer is model/formats/gguf.py).

Everything that can refuse (the type, the output path, the family, the plan, the tokenizer) is
checked before a byte is written; the weights are read only while the file is written.
"""

from __future__ import annotations

from pathlib import Path

from headprune_cli.errors import UsageError
from headprune_cli.files.outputs import check_output
from headprune_cli.model.formats.gguf_grid import LLAMA_CPP_TYPES, check_embedding_type, check_gguf_type
from headprune_cli.model.llama_cpp_env import engine_python as engine_python_of
from headprune_cli.stages.unit import Context, Result


def export_gguf_file(
    checkpoint: Path,
    out: Path,
    gguf_type: str,
    force: bool,
    ctx: Context,
    engine_python: Path | None = None,
    embedding_type: str | None = None,
) -> Result:
    result = write_gguf(
        checkpoint, out, gguf_type, force=force, engine_python=engine_python, embedding_type=embedding_type
    )
    n = len(result.fallback)
    fallback = f"; {n} {'matrix' if n == 1 else 'matrices'} of the model's own widths off the block grid kept in f16"
    fallback = fallback if n else ""
    kind = result.gguf_type + (f", embedding {result.embedding_type}" if result.embedding_type else "")
    ctx.print(
        f"wrote {out} (llama.cpp architecture {result.arch}, {kind}, {result.tensors} tensors{fallback})",
        soft_wrap=True,
        markup=False,
    )
    return Result([str(out)], value=result)


def write_gguf(
    checkpoint: str | Path,
    out: str | Path,
    gguf_type: str = "auto",
    *,
    arch: str = "auto",
    force: bool = False,
    engine_python: Path | None = None,
    embedding_type: str | None = None,
):
    """The checkpoint file as a GGUF file (what `export --gguf` writes; `arch` forces llama.cpp's
    `llama` or `deci` graph where both express the layout; `embedding_type` gives the token
    embedding and output head their own type). Returns gguf.GgufExport."""
    checkpoint, out = Path(checkpoint), Path(out)
    check_gguf_type(gguf_type)
    check_embedding_type(embedding_type)
    _require_gguf()
    # The k-quants are llama.cpp's own quantizer's: its environment is found before anything is read.
    engine = engine_python_of(engine_python, f"--gguf-type {gguf_type}") if gguf_type in LLAMA_CPP_TYPES else None
    check_output(out, force, inputs=[checkpoint])
    from headprune_cli.model.formats.gguf import export_gguf  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.model.streaming import export_specs  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)

    model, specs = export_specs(checkpoint)
    return export_gguf(model, specs, out, gguf_type, engine, arch, embedding_type)


def _require_gguf() -> None:
    try:
        import gguf  # noqa: F401, PLC0415 (an optional extra: is it installed?)
    except ImportError:
        raise UsageError("--gguf needs the gguf package: pip install 'headprune[gguf]'") from None
