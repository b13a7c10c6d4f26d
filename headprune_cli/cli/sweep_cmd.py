"""`headprune sweep`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from headprune_cli.stages.report import render
from headprune_cli.model.checkpoint import load
from headprune_cli.data import read_data
from headprune_cli.outputs import check_folder, check_output, make_folder
from headprune_cli.schema import envelope, input_ref, write_artifact
from headprune_cli.stages.sweep import DEFAULT_RATIOS, SweepOptions, curves, markdown, options_dict, parse_list, run_sweep, check_options
from headprune_cli.cli.common import Device, Dtype, console
from headprune_cli.device import check as check_device, place


def sweep(
    checkpoint: Annotated[Path, typer.Argument(help="The model to sweep (a headprune checkpoint).")],
    data: Annotated[Path, typer.Option("--data", help="Calibration data: scoring (and compensation).")],
    eval_data: Annotated[Path, typer.Option("--eval-data", help="Evaluation data for the quality curve.")],
    methods: Annotated[str, typer.Option("--methods", help="Comma-separated importance methods, e.g. taylor,gradient,random.")] = "taylor,gradient,random",
    ratios: Annotated[str, typer.Option("--ratios", help="Comma-separated fractions of heads to remove.")] = ",".join(f"{r:g}" for r in DEFAULT_RATIOS),
    compensate: Annotated[str, typer.Option("--compensate", help="none | bias | lstsq (closed-form, on --data).")] = "none",
    max_drop: Annotated[float, typer.Option("--max-drop", min=0, help="Budget: largest allowed drop of the main metric (points, or perplexity).")] = 1.0,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1)] = 16,
    max_length: Annotated[int, typer.Option("--max-length", min=1, help="Tokens per example (also the FLOPs sequence length).")] = 128,
    samples: Annotated[Optional[int], typer.Option("--samples", min=1, help="Use the first N calibration examples.")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Folder for sweep.json, sweep.md and curve.png (else JSON on stdout).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing output files.")] = False,
    device: Device = "auto",
    dtype: Dtype = "auto",
) -> None:
    """Score once per method, prune at each ratio, evaluate (no finetuning): the quality curve.

    Reports, per method, the largest ratio whose drop stays within --max-drop: the knee.

    Examples:

      headprune sweep model.safetensors --data calib.jsonl --eval-data dev.jsonl -o sweep/

      headprune sweep model.safetensors --data calib.txt --eval-data dev.txt --methods taylor,random \\
        --ratios 0.25,0.5,0.75 --compensate lstsq --max-drop 2 | jq .best
    """
    opts = SweepOptions(
        methods=parse_list(methods, str, "--methods"),
        ratios=parse_list(ratios, float, "--ratios"),
        compensate=compensate, max_drop=max_drop, batch_size=batch_size,
        max_length=max_length, samples=samples, seed=seed,
    )
    check_options(opts)
    check_device(device, dtype)
    outputs = _outputs(output, force, [checkpoint, data, eval_data])
    model = load(checkpoint)
    place(model, device, dtype)
    calib = read_data(data, model, max_length=max_length, samples=samples)
    evaluation = read_data(eval_data, model, max_length=max_length)
    payload = run_sweep(model, calib, evaluation, opts, progress=lambda m: console.print(f"[dim]{m}[/]", highlight=False))
    inputs = [input_ref("model", checkpoint, model.headprune.loaded_from[1]), input_ref("data", data), input_ref("eval_data", eval_data)]
    artifact = {**envelope("sweep", inputs, options_dict(opts)), **payload}
    from headprune_cli.stages.report import schema as report_schema  # noqa: F401  (registers the `sweep` kind)
    from headprune_cli.schema import KINDS

    KINDS["sweep"].model_validate(artifact)  # never write what cannot be read back
    table = markdown(payload)
    if output is None:
        write_artifact(artifact, None)
    else:
        make_folder(output)  # only now: a refused or failed sweep leaves no empty folder
        write_artifact(artifact, outputs["json"])
        render.write_text(outputs["md"], table)
        main = payload["main_metric"]
        render.curve_png(curves(payload), main["name"], outputs["png"], _budget_line(main, max_drop))
        console.print(f"wrote {outputs['json']}, {outputs['md']}, {outputs['png']}")
    for method, best in payload["best"].items():
        console.print(f"{method}: " + (f"largest ratio within budget {best['ratio']:g} (drop {best['drop']:+.3g})" if best else "no ratio within budget"), highlight=False)


def _budget_line(main: dict, max_drop: float) -> float:
    step = max_drop / 100 if main["unit"] == "points" else max_drop
    return main["baseline"] - step if main["higher_is_better"] else main["baseline"] + step


def _outputs(output: Path | None, force: bool, inputs) -> dict:
    if output is None:
        return {}
    check_folder(output, inputs, "-o folder")
    names = {"json": "sweep.json", "md": "sweep.md", "png": "curve.png"}
    if not output.is_dir():
        return {key: output / name for key, name in names.items()}
    return {key: check_output(output / name, force, inputs) for key, name in names.items()}
