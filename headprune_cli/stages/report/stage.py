"""The `report` stage: a pruned model against its baseline -> report JSON, Markdown,
JUnit XML, plots, and the CI gates' verdict (exit code 3 when a gate failed).

Every output is checked before any work, and written before the verdict: a failed gate
still leaves its report behind. Building the report (torch, the checkpoints) loads
inside `run`, so the options read without it.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from headprune_cli.artifacts.schema import portable_path, write_artifact
from headprune_cli.errors import EXIT_GATE_FAILED, UsageError
from headprune_cli.files.outputs import check_distinct, check_folder, check_output, make_folder
from headprune_cli.model.llama_cpp_env import ENGINE_PYTHON_HELP
from headprune_cli.runtime.device import check as check_device
from headprune_cli.stages.report import render
from headprune_cli.stages.unit import Context, Options, Result, Stage, device_option, dtype_option, option


class ReportStageOptions(Options):
    model: Path = option(..., "The pruned checkpoint.")
    data: Path = option(..., "Evaluation data (JSONL/CSV/text/safetensors) for the model's task.")
    baseline: str = option(
        "auto", "Baseline checkpoint, or 'auto' for the root model named in the pruned model's provenance."
    )
    scores: Path | None = option(None, "Scores JSON: adds importance to the head map and its heatmap.")
    max_drop: float | None = option(
        None,
        "Gate: largest allowed drop of the main metric, in points (accuracy/F1/fidelity x100) or in perplexity.",
        ge=0,
    )
    max_rel_drop: float | None = option(
        None, "Gate: largest allowed relative drop of the main metric (0.02 = 2%).", ge=0
    )
    min_speedup: float | None = option(
        None, "Gate: smallest allowed measured speedup (baseline median / pruned median).", ge=0
    )
    batch_size: int = option(8, "Batch size for evaluation and latency.", ge=1)
    seq_len: int | None = option(
        None,
        "Sequence length for FLOPs, latency, and the evaluation's max length (default: 128, "
        "or the model's maximum when smaller).",
        ge=1,
    )
    threads: int = option(2, "CPU threads while timing (torch.set_num_threads).", ge=1)
    repeats: int = option(10, "Timed runs per model after warm-up; 0 skips latency.", ge=0)
    warmup: int = option(2, "Untimed warm-up runs per model.", ge=0)
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
    device: str = device_option()
    dtype: str = dtype_option()
    # Serving a causal LM (ignored for encoders): KV cache on, prefill then decode, timed like --repeats.
    decode_prompt: int | None = option(
        None,
        "Causal LMs: prompt tokens prefilled before decoding (default: 128, or fewer to fit the model's positions).",
        ge=1,
    )
    decode_tokens: int = option(
        32,
        "Causal LMs: tokens generated one by one with the KV cache, timed as decode throughput; 0 skips decode.",
        ge=0,
    )
    decode_batch: int = option(1, "Causal LMs: sequences decoded together.", ge=1)
    latency: Path | None = option(
        None,
        "The baseline's latency table (`headprune profile`): adds its predicted speedup beside "
        "the measured one (cost.latency).",
    )
    onnx: Path | None = option(
        None,
        "The shipped ONNX file exported from --model (`export --onnx`, int8 with --quantize): evaluated, timed and "
        "gated in onnxruntime (CPU) in place of the PyTorch model.",
    )
    gguf: Path | None = option(
        None,
        "The shipped GGUF file exported from --model (`export --gguf`, a causal LM): evaluated, timed and gated "
        "in llama.cpp (CPU, f32 KV cache) in place of the PyTorch model.",
    )
    engine_python: Path | None = option(None, "With --gguf: " + ENGINE_PYTHON_HELP)

    def check(self) -> None:
        if self.min_speedup is not None and self.repeats == 0:
            raise UsageError("--min-speedup needs latency measurements; --repeats must be at least 1")


def run(opts: ReportStageOptions, ctx: Context) -> Result:
    from headprune_cli.stages.report.build import ReportOptions, build_report  # noqa: PLC0415 (keeps numpy, torch, transformers out of this module's import)

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
    # The report's `config` holds these, in ReportOptions' order.
    settings = ReportOptions(**{f.name: getattr(opts, f.name) for f in fields(ReportOptions)})
    if opts.onnx is not None:  # the baseline runs where onnxruntime does, for a fair comparison
        settings.device, settings.onnx = "cpu", str(opts.onnx)
    if opts.gguf is not None:  # likewise where llama.cpp runs
        settings.device, settings.gguf = "cpu", str(opts.gguf)
        settings.engine_python = None if opts.engine_python is None else str(opts.engine_python)
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
)
