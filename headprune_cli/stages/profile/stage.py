"""The `profile` stage: checkpoint -> latency JSON, measured on the device it runs on.

Options are read without torch; the measuring (measure.py, decode.py, ../timing.py) loads
inside `run`. Nothing is written unless every point was measured.
"""

from __future__ import annotations

from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from headprune_cli.artifacts.schema import write_artifact
from headprune_cli.errors import UsageError
from headprune_cli.files.outputs import check_output
from headprune_cli.model.latency_table import LatencyTable
from headprune_cli.runtime.device import check as check_device
from headprune_cli.stages.options import DeviceOptions, TimingOptions
from headprune_cli.stages.unit import Context, Result, Stage, option

GRID_HELP = (
    "Grid points per layer for attention and for the FFN (default 9: the smallest allowed count, every eighth of the "
    "full count, and all), interpolated linearly in between. Latency bends at the narrow end, where fixed costs "
    "dominate: every 5-point table measured overpredicted speedups (by 1.5-20% on average); 9-point tables lose "
    "that bias, not the machine's noise (BENCHMARKS section 16). 2 x 9 timed blocks per layer shape."
)


class ProfileOptions(TimingOptions, DeviceOptions):
    model: Path = option(
        ..., "Checkpoint to profile (the unpruned model that `score` and `select` will see).", argument=True
    )
    output: Path | None = option(None, "Latency JSON to write (default: stdout).", "-o", "--output")
    batch_size: int = option(8, "Sequences per forward (match `report --batch-size` and how you serve).", ge=1)
    seq_len: int | None = option(None, "Tokens per sequence (default: 128, or the model's maximum when smaller).", ge=1)
    points: int = option(9, GRID_HELP, ge=2, le=64)
    multiple_of: int = option(
        1,
        "Attention grid points are multiples of this many heads (KV groups for GQA): the alignment the hardware wants.",
        ge=1,
    )
    ffn_multiple_of: int = option(
        8, "FFN grid widths are multiples of this (8: what GPU matrix kernels tile by).", ge=1
    )
    context: int | None = option(
        None, "Causal LMs: also profile decode, one token per sequence against a KV cache of this many tokens.", ge=1
    )
    rounds: int = option(5, "Interleaved timing rounds per point; the table keeps their median and quartiles.", ge=1)
    min_time: float = option(
        0.05, "Seconds each round of each point runs at least (torch.utils.benchmark blocked_autorange).", ge=0.0
    )
    every_layer: bool = option(
        False, "Time every layer, not only the first of each shape (same heads, KV heads and FFN width)."
    )
    force: bool = option(False, "Overwrite OUTPUT if it exists.")


def run(opts: ProfileOptions, ctx: Context) -> Result:
    if opts.output is not None:
        check_output(opts.output, opts.force, inputs=[opts.model])
    check_device(opts.device, opts.dtype)
    from headprune_cli.model.checkpoint import read_info  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)
    from headprune_cli.stages.profile.build import profile_checkpoint  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    check_context(opts, read_info(opts.model).task)  # before the model is built or a bar is drawn

    with _progress(ctx) as advance:
        artifact, parsed = profile_checkpoint(opts, advance)
    write_artifact(artifact, opts.output)
    ctx.print(summary(parsed))
    return Result([str(opts.output)] if opts.output else [], value=artifact)


def summary(table) -> str:
    """One line: each phase's total as `select` and `report` will price it (model/latency_table.py)."""

    phases = [f"{name} {LatencyTable.from_artifact(table, name).full_ms():.4g} ms" for name in table.phases]
    measured = len({layer.measured_as for layer in table.phases["forward"].layers.values()})
    return f"latency table on {table.device.name}: {', '.join(phases)} ({measured} layer shape(s) measured)"


class _progress:
    """A progress bar on stderr; `advance(total)` sets the total once it is known."""

    def __init__(self, ctx: Context):

        self.bar = Progress(
            TextColumn("profiling"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=ctx.console,
            transient=True,
            disable=not ctx.progress,
        )
        self.task: TaskID | None = None

    def __enter__(self):
        self.bar.__enter__()
        self.task = self.bar.add_task("profile", total=None)
        return self._advance

    def _advance(self, total: int | None = None) -> None:
        assert self.task is not None  # __enter__ adds the task before it hands this method out
        if total is not None:
            self.bar.update(self.task, total=total)
        else:
            self.bar.advance(self.task)

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)


def check_context(opts: ProfileOptions, task: str) -> None:
    if opts.context is not None and task != "causal-lm":
        raise UsageError(
            f"--context profiles decode with a KV cache, which only causal LMs have (this is a {task} model)"
        )


# `headprune profile --help`: the command's text (cli/ builds the command from STAGE).
HELP = """Measure each layer's latency at a grid of kept heads (KV groups) and FFN widths; writes a latency table.

    Each layer's block is timed (torch.utils.benchmark, interleaved rounds,
    medians after warm-up) as copies sliced to k heads or w neurons, one
    layer at a time; layers of one shape share a measurement unless
    --every-layer. The default grid is 9 points per layer: the smallest
    count, every eighth of the full count and all (aligned to --multiple-of and
    --ffn-multiple-of); `select` and `report` interpolate between them.

    Examples:

      headprune profile model.safetensors -o latency.json

      headprune profile model.safetensors --device cuda --dtype bf16 --batch-size 1 --context 1024 -o latency.json

      headprune select scores.json --latency latency.json --target-latency 0.7 -o plan.json
    """

STAGE = Stage(
    "profile",
    ProfileOptions,
    run,
    stem="latency",
    inputs={"model": ("model",)},
    outputs={"output": "{stem}.json"},
    makes={"latency": "output"},
    needs=("model",),
    help=HELP,
)
