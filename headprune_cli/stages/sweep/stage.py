"""The `sweep` stage: quality against heads removed (per method) or FLOPs kept (per route), without
finetuning; the loop is loop.py, what a person reads views.py."""

from __future__ import annotations

from pathlib import Path

from headprune_cli.artifacts.schema import envelope, input_ref, model_of, write_artifact
from headprune_cli.data.readers import read_data
from headprune_cli.files.outputs import check_folder, check_output, make_folder
from headprune_cli.model.checkpoint import load
from headprune_cli.runtime.device import check as check_device
from headprune_cli.runtime.device import place
from headprune_cli.stages.options import DeviceOptions
from headprune_cli.stages.report import render
from headprune_cli.stages.sweep import views
from headprune_cli.stages.sweep.loop import check_options, check_routes, run_sweep
from headprune_cli.stages.sweep.settings import SweepSettings
from headprune_cli.stages.unit import Context, Result, Stage, option

FILES = {"json": "sweep.json", "md": "sweep.md", "png": "curve.png"}


class SweepOptions(SweepSettings, DeviceOptions):
    checkpoint: Path = option(..., "The model to sweep (a headprune checkpoint).", argument=True)
    data: Path = option(..., "Calibration data: scoring (and compensation).")
    eval_data: Path = option(..., "Evaluation data for the quality curve.")
    output: Path | None = option(
        None, "Folder for sweep.json, sweep.md and curve.png (else JSON on stdout).", "-o", "--output"
    )
    force: bool = option(False, "Overwrite existing output files.")

    def check(self) -> None:
        check_options(self)
        if self.target_flops is not None:
            check_routes(self.routes, self.methods)


def run(opts: SweepOptions, ctx: Context) -> Result:

    opts.check()
    check_device(opts.device, opts.dtype)
    outputs = _outputs(opts.output, opts.force, [opts.checkpoint, opts.data, opts.eval_data])
    model = load(opts.checkpoint)
    place(model, opts.device, opts.dtype)
    calib = read_data(opts.data, model, max_length=opts.max_length, samples=opts.samples)
    evaluation = read_data(opts.eval_data, model, max_length=opts.max_length)
    payload = run_sweep(model, calib, evaluation, opts, progress=lambda m: ctx.print(f"[dim]{m}[/]", highlight=False))
    artifact = _artifact(model, opts, payload)
    if opts.output is None:
        write_artifact(artifact, None)
    else:
        make_folder(opts.output)  # only now: a refused or failed sweep leaves no empty folder
        write_artifact(artifact, outputs["json"])
        _write_views(payload, outputs, opts.max_drop)
        ctx.print(f"wrote {outputs['json']}, {outputs['md']}, {outputs['png']}")
    _tell(payload, ctx)
    return Result([str(opts.output)] if opts.output is not None else [], value=payload)


def _write_views(payload: dict, outputs: dict, max_drop: float) -> None:

    main = payload["main_metric"]
    line = _budget_line(main, max_drop)
    render.write_text(outputs["md"], views.markdown(payload))
    if views.is_flops_sweep(payload):
        render.budget_curves_png(views.flops_curves(payload), main["name"], outputs["png"], line)
    else:
        render.curve_png(views.ratio_curves(payload), main["name"], outputs["png"], line)


def _tell(payload: dict, ctx: Context) -> None:
    if views.is_flops_sweep(payload):
        for route, best in payload["best"].items():
            ctx.print(
                f"{route}: "
                + (
                    f"fewest FLOPs kept within budget {best['flops_kept']:.1%} (drop {best['drop']:+.3g})"
                    if best
                    else "no target within budget"
                ),
                highlight=False,
            )
        return
    for method, best in payload["best"].items():
        ctx.print(
            f"{method}: "
            + (
                f"largest ratio within budget {best['ratio']:g} (drop {best['drop']:+.3g})"
                if best
                else "no ratio within budget"
            ),
            highlight=False,
        )


def _artifact(model, opts: SweepOptions, payload: dict) -> dict:

    inputs = [
        input_ref("model", opts.checkpoint, model.headprune.source_sha),
        input_ref("data", opts.data),
        input_ref("eval_data", opts.eval_data),
    ]
    artifact = {**envelope("sweep", inputs, opts.recorded()), **payload}
    model_of("sweep").model_validate(artifact)  # never write what cannot be read back
    return artifact


def _budget_line(main: dict, max_drop: float) -> float:
    step = max_drop / 100 if main["unit"] == "points" else max_drop
    return main["baseline"] - step if main["higher_is_better"] else main["baseline"] + step


def _outputs(output: Path | None, force: bool, inputs) -> dict:
    if output is None:
        return {}
    check_folder(output, inputs, "-o folder")
    if not output.is_dir():
        return {key: output / name for key, name in FILES.items()}
    return {key: check_output(output / name, force, inputs) for key, name in FILES.items()}


# `headprune sweep --help`: the command's text (cli/ builds the command from STAGE).
HELP = """Score once per method, prune at each ratio, evaluate (no finetuning): the quality curve.

    Reports, per method, the largest ratio whose drop stays within --max-drop: the knee.

    Examples:

      headprune sweep model.safetensors --data calib.jsonl --eval-data dev.jsonl -o sweep/

      headprune sweep model.safetensors --data calib.txt --eval-data dev.txt --methods taylor,random \\
        --ratios 0.25,0.5,0.75 --compensate lstsq --max-drop 2 | jq .best
    """

STAGE = Stage(
    "sweep",
    SweepOptions,
    run,
    stem="sweep",
    inputs={"checkpoint": ("model",), "data": ("data",), "eval_data": ("eval_data",)},
    outputs={"output": "{stem}"},
    makes={"sweep": "output"},
    needs=("checkpoint", "data", "eval_data"),
    help=HELP,
)
