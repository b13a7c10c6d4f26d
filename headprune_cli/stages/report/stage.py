"""The `report` stage: a pruned model against its baseline -> report JSON, Markdown,
JUnit XML, plots, and the CI gates' verdict (exit code 3 when a gate failed).

Every output is checked before any work, and written before the verdict: a failed gate
still leaves its report behind. Building the report (torch, the checkpoints) loads
inside `run`, so the options read without it.
"""

from __future__ import annotations

from pathlib import Path

from headprune_cli.artifacts.schema import portable_path, write_artifact
from headprune_cli.errors import EXIT_GATE_FAILED, UsageError
from headprune_cli.files.outputs import check_distinct, check_folder, check_output, make_folder
from headprune_cli.runtime.device import check as check_device
from headprune_cli.stages.report import render
from headprune_cli.stages.report.settings import ReportSettings
from headprune_cli.stages.unit import Context, Result, Stage, option


class ReportStageOptions(ReportSettings):
    model: Path = option(..., "The pruned checkpoint.")
    data: Path = option(..., "Evaluation data (JSONL/CSV/text/safetensors) for the model's task.")
    baseline: str = option(
        "auto", "Baseline checkpoint, or 'auto' for the root model named in the pruned model's provenance."
    )
    scores: Path | None = option(None, "Scores JSON: adds importance to the head map and its heatmap.")
    json_out: str | None = option(None, "Write the report JSON here ('-' for stdout).", "--json")
    markdown_out: Path | None = option(None, "Write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY).", "--markdown")
    plot_dir: Path | None = option(
        None,
        "Folder for PNG plots: head_map.png, kept/removed heads per layer (coloured by importance with --scores).",
        "--plot",
        folder=True,
    )
    junit_out: Path | None = option(None, "Write JUnit XML, one test case per gate.", "--junit")
    force: bool = option(False, "Overwrite existing output files.")

    def check(self) -> None:
        if self.min_speedup is not None and self.repeats == 0:
            raise UsageError("--min-speedup needs latency measurements; --repeats must be at least 1")


def run(opts: ReportStageOptions, ctx: Context) -> Result:
    from headprune_cli.stages.report.build import build_report  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)

    inputs = [
        opts.model,
        opts.data,
        opts.scores,
        opts.baseline,
        opts.latency,
        opts.onnx,
        opts.gguf,
    ]  # `auto` reaches the root through the model's provenance
    outputs = _check_outputs(opts, inputs)
    opts.check()
    from headprune_cli.stages.report.llama_cpp import check_gguf_options  # noqa: PLC0415 (torch: only once the options are read)
    from headprune_cli.stages.report.shipped import check_onnx_options  # noqa: PLC0415 (torch: only once the options are read)

    check_gguf_options(opts.gguf, opts.onnx, opts.device, opts.dtype)
    check_onnx_options(opts.onnx, opts.device, opts.dtype)
    check_device(opts.device, opts.dtype)
    settings: ReportSettings = opts
    if opts.onnx is not None or opts.gguf is not None:
        # the baseline runs where onnxruntime or llama.cpp does, for a fair comparison
        settings = opts.model_copy(update={"device": "cpu"})
    report = build_report(opts.model, opts.baseline, opts.data, opts.scores, settings)
    _portable_model_paths(report, outputs.get("json") or outputs.get("markdown"))
    if opts.json_out is not None:
        write_artifact(report, opts.json_out)
    if opts.markdown_out is not None:
        render.write_text(opts.markdown_out, render.markdown(report))
    if opts.junit_out is not None:
        render.write_text(opts.junit_out, render.junit(report))
    if opts.plot_dir is not None:
        make_folder(opts.plot_dir)  # only now: a refused or failed report leaves no empty folder
        render.head_map_png(report, outputs["plot"])
    render.terminal(report, ctx.console)
    written = [str(path) for path in outputs.values()]
    failed = [g["name"] for g in report["gates"] if not g["passed"]]
    if failed:
        # A verdict, not an error: `Error:` lines mean the tool or its input broke (exit 1/2).
        ctx.console.print(
            f"FAIL: gate {', '.join(failed)} failed: {render.headline(report)}",
            markup=False,
            highlight=False,
            emoji=False,
            soft_wrap=True,
        )
        return Result(written, exit_code=EXIT_GATE_FAILED, value=report)
    return Result(written, value=report)


def _portable_model_paths(report: dict, home: Path | None) -> None:
    """Name the models as the report's own folder sees them (as its `inputs` do), so that
    a report in an out folder has the same bytes wherever the folder is."""
    if home is not None:
        for side in [*report["models"].values(), *([report["shipped"]] if report.get("shipped") else [])]:
            side["path"] = portable_path(side["path"], Path(home).parent)


def _check_outputs(opts: ReportStageOptions, inputs: list) -> dict[str, Path]:
    """Every output is checked before any work, so a refused output costs nothing."""
    outputs = {}
    if opts.json_out is not None and opts.json_out != "-":
        outputs["json"] = check_output(opts.json_out, opts.force, inputs)
    for key, path in (("markdown", opts.markdown_out), ("junit", opts.junit_out)):
        if path is not None:
            outputs[key] = check_output(path, opts.force, inputs)
    if opts.plot_dir is not None:
        check_folder(opts.plot_dir, inputs, "--plot folder")
        png = opts.plot_dir / "head_map.png"
        outputs["plot"] = check_output(png, opts.force, inputs) if opts.plot_dir.is_dir() else png
    check_distinct(outputs.values())
    return outputs


# `headprune report --help`: the command's text (cli/ builds the command from STAGE).
HELP = """Compare a pruned model with its baseline: quality, size, FLOPs, measured speed; gate CI.

    For causal LMs it also states KV-cache bytes per token and measures prefill and
    decode (tokens/s with the KV cache on), each beside its prediction.

    With --onnx FILE (an `export --onnx` file of --model) that file, run in onnxruntime,
    stands for the pruned model in quality, latency and gates: the gate covers what ships.
    --gguf FILE (an `export --gguf` file of a causal LM) does the same in llama.cpp, run from
    its own environment (--engine-python, $HEADPRUNE_LLAMA_CPP_ENV, or the repository's
    .engines/llama-cpp, which `bash scripts/engines/llama_cpp.sh` links to its build).

    Exit codes: 0 every gate passed (or none given), 3 a gate failed (the model got worse
    than the budget), 1 an error, 2 a usage error. Outputs are written before exit 3.

    Examples:

      headprune report --model small.safetensors --data dev.jsonl --max-drop 1.0

      headprune report --model small.safetensors --baseline base.safetensors --data dev.jsonl \\
        --min-speedup 1.3 --json report.json --markdown report.md --junit gates.xml

      cat report.md >> "$GITHUB_STEP_SUMMARY"

      headprune report --model small.safetensors --onnx small-int8.onnx --data dev.jsonl --max-drop 1.0   # the shipped file

      headprune report --model small-llama.safetensors --gguf small-llama-q8_0.gguf --data valid.txt --max-rel-drop 0.01
    """  # noqa: E501 (help text: the example line stays whole, as the user copies it)

STAGE = Stage(
    "report",
    ReportStageOptions,
    run,
    stem="report",
    inputs={
        "model": ("model",),
        "baseline": ("baseline",),
        "data": ("eval_data",),
        "scores": ("scores",),
        "latency": ("latency",),
    },
    outputs={"json": "{stem}.json", "markdown": "{stem}.md"},
    makes={"report": "json"},
    needs=("model", "data"),
    optional_outputs={"plot": "{stem}-plots", "junit": "{stem}.junit.xml"},
    help=HELP,
)
