"""`headprune report`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from headprune_cli.stages.report import render
from headprune_cli.errors import EXIT_GATE_FAILED, UsageError
from headprune_cli.outputs import check_distinct, check_folder, check_output, make_folder
from headprune_cli.stages.report.build import ReportOptions, build_report
from headprune_cli.schema import portable_path, write_artifact
from headprune_cli.cli.common import Device, Dtype, console
from headprune_cli.device import check as check_device


def report(
    model: Annotated[Path, typer.Option("--model", help="The pruned checkpoint.")],
    data: Annotated[Path, typer.Option("--data", help="Evaluation data (JSONL/CSV/text/safetensors) for the model's task.")],
    baseline: Annotated[str, typer.Option("--baseline", help="Baseline checkpoint, or 'auto' for the root model named in the pruned model's provenance.")] = "auto",
    scores: Annotated[Optional[Path], typer.Option("--scores", help="Scores JSON: adds importance to the head map and its heatmap.")] = None,
    max_drop: Annotated[Optional[float], typer.Option("--max-drop", min=0, help="Gate: largest allowed drop of the main metric, in points (accuracy/F1/fidelity x100) or in perplexity.")] = None,
    max_rel_drop: Annotated[Optional[float], typer.Option("--max-rel-drop", min=0, help="Gate: largest allowed relative drop of the main metric (0.02 = 2%).")] = None,
    min_speedup: Annotated[Optional[float], typer.Option("--min-speedup", min=0, help="Gate: smallest allowed measured speedup (baseline median / pruned median).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Batch size for evaluation and latency.")] = 8,
    seq_len: Annotated[int | None, typer.Option("--seq-len", min=1, help="Sequence length for FLOPs, latency, and the evaluation's max length (default: 128, or the model's maximum when smaller).")] = None,
    threads: Annotated[int, typer.Option("--threads", min=1, help="CPU threads while timing (torch.set_num_threads).")] = 2,
    repeats: Annotated[int, typer.Option("--repeats", min=0, help="Timed runs per model after warm-up; 0 skips latency.")] = 10,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed warm-up runs per model.")] = 2,
    json_out: Annotated[Optional[str], typer.Option("--json", help="Write the report JSON here ('-' for stdout).")] = None,
    markdown_out: Annotated[Optional[Path], typer.Option("--markdown", help="Write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY).")] = None,
    plot_dir: Annotated[Optional[Path], typer.Option("--plot", help="Folder for PNG plots: head_map.png, kept/removed heads per layer (coloured by importance with --scores).")] = None,
    junit_out: Annotated[Optional[Path], typer.Option("--junit", help="Write JUnit XML, one test case per gate.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing output files.")] = False,
    device: Device = "auto",
    dtype: Dtype = "auto",
    # Serving a causal LM (ignored for encoders): KV cache on, prefill then decode, timed like --repeats.
    decode_prompt: Annotated[int | None, typer.Option("--decode-prompt", min=1, help="Causal LMs: prompt tokens prefilled before decoding (default: 128, or fewer to fit the model's positions).")] = None,
    decode_tokens: Annotated[int, typer.Option("--decode-tokens", min=0, help="Causal LMs: tokens generated one by one with the KV cache, timed as decode throughput; 0 skips decode.")] = 32,
    decode_batch: Annotated[int, typer.Option("--decode-batch", min=1, help="Causal LMs: sequences decoded together.")] = 1,
) -> None:
    """Compare a pruned model with its baseline: quality, size, FLOPs, measured speed; gate CI.

    For causal LMs it also states KV-cache bytes per token and measures prefill and
    decode (tokens/s with the KV cache on), each beside its prediction.

    Exit codes: 0 every gate passed (or none given), 3 a gate failed (the model got worse
    than the budget), 1 an error, 2 a usage error. Outputs are written before exit 3.

    Examples:

      headprune report --model small.safetensors --data dev.jsonl --max-drop 1.0

      headprune report --model small.safetensors --baseline base.safetensors --data dev.jsonl \\
        --min-speedup 1.3 --json report.json --markdown report.md --junit gates.xml

      cat report.md >> "$GITHUB_STEP_SUMMARY"
    """
    inputs = [model, data, scores, baseline]  # `auto` reaches the root through the model's provenance
    outputs = _check_outputs(json_out, markdown_out, junit_out, plot_dir, force, inputs)
    if min_speedup is not None and repeats == 0:
        raise UsageError("--min-speedup needs latency measurements; --repeats must be at least 1")
    check_device(device, dtype)
    opts = ReportOptions(batch_size, seq_len, threads, repeats, warmup, max_drop, max_rel_drop, min_speedup, device, dtype)
    opts.decode_prompt, opts.decode_tokens, opts.decode_batch = decode_prompt, decode_tokens, decode_batch
    result = build_report(model, baseline, data, scores, opts)
    _portable_model_paths(result, outputs.get("json") or outputs.get("markdown"))
    if json_out is not None:
        write_artifact(result, json_out)
    if markdown_out is not None:
        render.write_text(markdown_out, render.markdown(result))
    if junit_out is not None:
        render.write_text(junit_out, render.junit(result))
    if plot_dir is not None:
        make_folder(plot_dir)  # only now: a refused or failed report leaves no empty folder
        render.head_map_png(result, outputs["plot"])
    render.terminal(result, console)
    failed = [g["name"] for g in result["gates"] if not g["passed"]]
    if failed:
        # A verdict, not an error: `Error:` lines mean the tool or its input broke (exit 1/2).
        print(f"FAIL: gate {', '.join(failed)} failed: {render.headline(result)}", file=sys.stderr)
        raise typer.Exit(EXIT_GATE_FAILED)


def _portable_model_paths(result: dict, home: Path | None) -> None:
    """Name the models as the report's own folder sees them (as its `inputs` do), so that
    a report in an out folder has the same bytes wherever the folder is."""
    if home is not None:
        for side in result["models"].values():
            side["path"] = portable_path(side["path"], Path(home).parent)


def _check_outputs(json_out, markdown_out, junit_out, plot_dir, force, inputs) -> dict:
    """Every output is checked before any work, so a refused output costs nothing."""
    outputs = {}
    if json_out is not None and json_out != "-":
        outputs["json"] = check_output(json_out, force, inputs)
    for key, path in (("markdown", markdown_out), ("junit", junit_out)):
        if path is not None:
            outputs[key] = check_output(path, force, inputs)
    if plot_dir is not None:
        check_folder(plot_dir, inputs, "--plot folder")
        png = plot_dir / "head_map.png"
        outputs["plot"] = check_output(png, force, inputs) if plot_dir.is_dir() else png
    check_distinct(outputs.values())
    return outputs
