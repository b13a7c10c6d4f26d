"""`headprune report` (the stage: stages/report/stage.py)."""

from __future__ import annotations

from headprune_cli.cli.command import from_options
from headprune_cli.cli.common import context
from headprune_cli.stages.report import stage


@from_options(stage.ReportStageOptions)
def report(opts: stage.ReportStageOptions):
    """Compare a pruned model with its baseline: quality, size, FLOPs, measured speed; gate CI.

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
    return stage.run(opts, context())
