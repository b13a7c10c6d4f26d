"""The `sweep` stage: quality against heads removed, per method, without finetuning (stages/sweep.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from headprune_cli.device import DEVICE_HELP, DTYPE_HELP
from headprune_cli.outputs import check_folder, check_output, make_folder
from headprune_cli.stages.sweep import DEFAULT_RATIOS, SweepSettings, check_options
from headprune_cli.stages.unit import Context, Options, Result, Stage, comma_list, option

FILES = {"json": "sweep.json", "md": "sweep.md", "png": "curve.png"}


class SweepOptions(Options):
    checkpoint: Path = option(..., "The model to sweep (a headprune checkpoint).", argument=True)
    data: Path = option(..., "Calibration data: scoring (and compensation).")
    eval_data: Path = option(..., "Evaluation data for the quality curve.")
    methods: str = option("taylor,gradient,random", "Comma-separated importance methods, e.g. taylor,gradient,random.")
    ratios: str = option(",".join(f"{r:g}" for r in DEFAULT_RATIOS), "Comma-separated fractions of heads to remove.")
    compensate: str = option("none", "none | bias | lstsq (closed-form, on --data).")
    max_drop: float = option(1.0, "Budget: largest allowed drop of the main metric (points, or perplexity).", ge=0)
    batch_size: int = option(16, "", ge=1)
    max_length: int = option(128, "Tokens per example (also the FLOPs sequence length).", ge=1)
    samples: Optional[int] = option(None, "Use the first N calibration examples.", ge=1)
    seed: int = option(0, "")
    output: Optional[Path] = option(None, "Folder for sweep.json, sweep.md and curve.png (else JSON on stdout).", "-o", "--output")
    force: bool = option(False, "Overwrite existing output files.")
    device: str = option("auto", DEVICE_HELP)
    dtype: str = option("auto", DTYPE_HELP)

    def settings(self) -> SweepSettings:
        settings = SweepSettings(
            methods=comma_list(self.methods, str, "--methods"), ratios=comma_list(self.ratios, float, "--ratios"),
            compensate=self.compensate, max_drop=self.max_drop, batch_size=self.batch_size,
            max_length=self.max_length, samples=self.samples, seed=self.seed,
        )
        check_options(settings)
        return settings


def run(opts: SweepOptions, ctx: Context) -> Result:
    from headprune_cli.data import read_data
    from headprune_cli.device import check as check_device, place
    from headprune_cli.model.checkpoint import load
    from headprune_cli.schema import write_artifact
    from headprune_cli.stages.report import render
    from headprune_cli.stages.sweep import curves, markdown, run_sweep

    settings = opts.settings()
    check_device(opts.device, opts.dtype)
    outputs = _outputs(opts.output, opts.force, [opts.checkpoint, opts.data, opts.eval_data])
    model = load(opts.checkpoint)
    place(model, opts.device, opts.dtype)
    calib = read_data(opts.data, model, max_length=opts.max_length, samples=opts.samples)
    evaluation = read_data(opts.eval_data, model, max_length=opts.max_length)
    payload = run_sweep(model, calib, evaluation, settings, progress=lambda m: ctx.print(f"[dim]{m}[/]", highlight=False))
    artifact = _artifact(model, opts, settings, payload)
    if opts.output is None:
        write_artifact(artifact, None)
    else:
        make_folder(opts.output)  # only now: a refused or failed sweep leaves no empty folder
        write_artifact(artifact, outputs["json"])
        render.write_text(outputs["md"], markdown(payload))
        main = payload["main_metric"]
        render.curve_png(curves(payload), main["name"], outputs["png"], _budget_line(main, opts.max_drop))
        ctx.print(f"wrote {outputs['json']}, {outputs['md']}, {outputs['png']}")
    for method, best in payload["best"].items():
        ctx.print(f"{method}: " + (f"largest ratio within budget {best['ratio']:g} (drop {best['drop']:+.3g})" if best else "no ratio within budget"), highlight=False)
    return Result([str(opts.output)] if opts.output is not None else [], value=payload)


def _artifact(model, opts: SweepOptions, settings: SweepSettings, payload: dict) -> dict:
    from headprune_cli.schema import KINDS, envelope, input_ref
    from headprune_cli.stages.report import schema as report_schema  # noqa: F401  (registers the `sweep` kind)
    from headprune_cli.stages.sweep import options_dict

    inputs = [input_ref("model", opts.checkpoint, model.headprune.loaded_from[1]), input_ref("data", opts.data), input_ref("eval_data", opts.eval_data)]
    artifact = {**envelope("sweep", inputs, options_dict(settings)), **payload}
    KINDS["sweep"].model_validate(artifact)  # never write what cannot be read back
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


STAGE = Stage(
    "sweep", SweepOptions, run, stem="sweep",
    inputs={"checkpoint": ("model",), "data": ("data",), "eval_data": ("eval_data",)},
    outputs={"output": "{stem}"}, makes={"sweep": "output"}, needs=("checkpoint", "data", "eval_data"),
)
