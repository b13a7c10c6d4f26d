"""`export --gguf FILE`: the export stage's GGUF branch (the writer is model/formats/gguf.py).

Everything that can refuse (the type, the output path, the family, the plan, the tokenizer) is
checked before a byte is written; the weights are read only while the file is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from headprune_cli.errors import DataError, UsageError
from headprune_cli.files.outputs import check_output
from headprune_cli.model.formats.gguf_grid import (
    LLAMA_CPP_TYPES,
    WEIGHTED_TYPES,
    check_embedding_type,
    check_gguf_type,
)
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
    calib_data: Path | None = None,
    calib_samples: int = 128,
    rounding: str = "nearest",
) -> Result:
    calibration = Calibration(calib_data, calib_samples, ctx, rounding) if calib_data is not None else None
    result = write_gguf(
        checkpoint,
        out,
        gguf_type,
        force=force,
        engine_python=engine_python,
        embedding_type=embedding_type,
        calibration=calibration,
    )
    n = len(result.fallback)
    fallback = f"; {n} {'matrix' if n == 1 else 'matrices'} of the model's own widths off the block grid kept in f16"
    fallback = fallback if n else ""
    kind = result.gguf_type + (f", embedding {result.embedding_type}" if result.embedding_type else "")
    if calibration is not None:
        how = "rounded by GPTQ on" if rounding == "gptq" else "weighted by"
        kind += f", {how} {calibration.rows} calibration rows"
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
    calibration: Calibration | None = None,
):
    """The checkpoint file as a GGUF file (what `export --gguf` writes; `arch` forces llama.cpp's
    `llama` or `deci` graph where both express the layout; `embedding_type` gives the token
    embedding and output head their own type; `calibration` weighs the q4_0 blocks by the
    importance of each column on its text). Returns gguf.GgufExport."""
    checkpoint, out = Path(checkpoint), Path(out)
    check_gguf_type(gguf_type)
    check_embedding_type(embedding_type)
    check_weighted(gguf_type, calibration)
    _require_gguf()
    # The k-quants are llama.cpp's own quantizer's: its environment is found before anything is read.
    engine = engine_python_of(engine_python, f"--gguf-type {gguf_type}") if gguf_type in LLAMA_CPP_TYPES else None
    check_output(out, force, inputs=[checkpoint] + ([calibration.data] if calibration else []))
    from headprune_cli.model.formats.gguf import export_gguf  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.model.streaming import export_specs  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)

    importance, quantized = calibration.weigh(checkpoint) if calibration else ({}, {})
    model, specs = export_specs(checkpoint)
    return export_gguf(model, specs, out, gguf_type, engine, arch, embedding_type, importance, quantized)


def check_weighted(gguf_type: str, calibration: Calibration | None) -> None:
    """--calib-data weighs the blocks headprune quantizes itself: q4_0 only (the k-quants are
    llama.cpp's quantizer's, which takes no importance through its Python binding). Refused
    before the model is read."""
    if calibration is None:
        return
    if gguf_type not in WEIGHTED_TYPES:
        raise UsageError(
            f"--calib-data with --gguf goes with --gguf-type {' or '.join(WEIGHTED_TYPES)} "
            f"(importance-weighted blocks; got {gguf_type})"
        )
    if not calibration.data.is_file():
        raise DataError(f"{calibration.data}: no such data file")


@dataclass
class Calibration:
    """The text whose activations weigh the quantized blocks, read at up to MAX_LENGTH tokens a
    row (llama-imatrix's default context): `rounding` "nearest" weighs each block's scale by
    its columns' importance (gguf_imatrix); "gptq" also rounds each matrix's columns in turn,
    spreading each one's error over those after it (gguf_gptq)."""

    data: Path
    samples: int
    ctx: Context | None = None
    rounding: str = "nearest"
    rows: int = 0
    MAX_LENGTH = 512
    BATCH = 8

    def weigh(self, checkpoint: Path) -> tuple[dict, dict]:
        """(weight name -> importance, weight name -> q4_0 bytes rounded already): what
        gguf.export_gguf takes."""
        from headprune_cli.data.readers import read_data  # noqa: PLC0415 (keeps torch out of this module's import)
        from headprune_cli.model.checkpoint import load  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
        from headprune_cli.model.formats.gguf_gptq import gptq_model  # noqa: PLC0415 (keeps torch out of this module's import)
        from headprune_cli.model.formats.gguf_imatrix import collect_importance  # noqa: PLC0415 (keeps torch out of this module's import)

        model = load(checkpoint)
        data = read_data(self.data, model, max_length=self.MAX_LENGTH, samples=self.samples, need_labels=False)
        self.rows = len(data)
        if self.rounding == "gptq":
            return {}, gptq_model(model, lambda label: self._steps(data, f"{label}: reading the text"))
        return collect_importance(model, self._steps(data, "weighing columns")), {}

    def _steps(self, data, description: str):
        from rich.progress import track  # noqa: PLC0415 (rich's progress only when it runs)

        from headprune_cli.data.readers import batches, num_batches  # noqa: PLC0415 (keeps torch out of this module's import)

        return track(
            batches(data, self.BATCH),
            description=description,
            total=num_batches(data, self.BATCH),
            console=self.ctx.console if self.ctx else None,
            transient=True,
            disable=not (self.ctx is not None and self.ctx.progress),
        )


def _require_gguf() -> None:
    try:
        import gguf  # noqa: F401, PLC0415 (an optional extra: is it installed?)
    except ImportError:
        raise UsageError("--gguf needs the gguf package: pip install 'headprune[gguf]'") from None
