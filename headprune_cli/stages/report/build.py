"""`report`: what a pruned model lost and gained against its baseline, and the CI gates.

Quality comes from objectives.evaluate (one evaluation code path for every stage),
cost from cost.py (analytic, exact for the linear layers and attention scores), speed
from latency.py (measured, interleaved). Everything timing-dependent lives under the
report's `measured` key, so that two runs on the same inputs differ only there.
Rendering (terminal, Markdown, JUnit, PNG) is in render.py.
"""

from __future__ import annotations

import math
import sys
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from headprune_cli.artifacts.schema import envelope, input_ref, read_artifact
from headprune_cli.data import readers as data_mod
from headprune_cli.errors import ArchitectureError, CheckpointError, DataError, UsageError
from headprune_cli.files.io import sha256_file
from headprune_cli.model.checkpoint import load, read_info
from headprune_cli.model.cost import count_params, flops_per_token
from headprune_cli.model.layout import ModelInfo, info_of
from headprune_cli.model.llama_cpp_env import engine_python
from headprune_cli.runtime.device import check as check_device
from headprune_cli.runtime.device import input_device, place
from headprune_cli.stages import objectives
from headprune_cli.stages.model_latency import max_sequence, measure, synthetic_inputs
from headprune_cli.stages.objectives import drop_unit, metric_dicts, worse_by, worse_than
from headprune_cli.stages.report import serving, zero_shot
from headprune_cli.stages.report.latency_cost import latency_section, read_table
from headprune_cli.stages.report.llama_cpp import check_task, load_gguf
from headprune_cli.stages.report.settings import CONFIG_KEYS, ReportSettings
from headprune_cli.stages.report.shipped import checkpoint_metrics, load_shipped

# The metric a gate reads, per task, and whether its drop is stated in points (x100).
MAIN_METRIC = {"classification": "accuracy", "causal-lm": "perplexity", "embedding": "fidelity"}
MAX_LINEAGE_DEPTH = 64


# --- which baseline ---------------------------------------------------------------
def resolve_baseline(pruned_path: str | Path, baseline: str | Path) -> Path:
    """`--baseline auto`: the root model named by the pruned checkpoint's provenance."""
    if str(baseline) != "auto":
        return Path(baseline)
    provenance = read_info(pruned_path).provenance
    root, root_path = provenance.get("root"), provenance.get("root_path")
    if not root:
        raise UsageError(
            f"--baseline auto: {pruned_path} has no root model in its provenance (it was "
            "never pruned); pass --baseline CKPT"
        )
    if not root_path:
        raise CheckpointError(
            f"--baseline auto: {pruned_path} names its root only by sha256 {root[:12]}; pass --baseline CKPT"
        )
    path = Path(pruned_path).parent / root_path
    if not path.is_file():
        raise CheckpointError(
            f"--baseline auto: root model {path} (from the provenance of {pruned_path}) not found; pass --baseline CKPT"
        )
    if sha256_file(path) != root:
        raise CheckpointError(
            f"--baseline auto: {path} is not the root model any more (sha256 differs from "
            f"{root[:12]}); pass --baseline CKPT"
        )
    return path


def check_comparable(baseline: ModelInfo, pruned: ModelInfo) -> None:
    if baseline.family != pruned.family:
        raise ArchitectureError(
            f"the baseline is a {baseline.family} model and the pruned model a {pruned.family} "
            "model; compare models of one family"
        )
    if baseline.task != pruned.task:
        raise ArchitectureError(f"the baseline is a {baseline.task} model and the pruned model a {pruned.task} model")


def lineage(pruned_path: str | Path, baseline_sha: str, pruned_sha: str) -> dict:
    """Whether the pruned checkpoint descends from the baseline, following provenance.

    `pruned_sha` is the hash `load` already took (of the weights file, for an export folder)."""
    path = Path(pruned_path)
    if pruned_sha == baseline_sha:
        return {"descendant": True, "how": "the pruned model and the baseline are the same file"}
    if read_info(path).provenance.get("root") == baseline_sha:
        return {"descendant": True, "how": "the baseline is the root of the pruned model"}
    for _ in range(MAX_LINEAGE_DEPTH):
        provenance = read_info(path).provenance
        if provenance.get("parent") == baseline_sha:
            return {"descendant": True, "how": "the baseline is an ancestor of the pruned model"}
        parent_path = provenance.get("parent_path")
        if not parent_path or not (path.parent / parent_path).is_file():
            break
        path = path.parent / parent_path
    return {
        "descendant": False,
        "how": "the pruned model does not descend from the baseline (provenance names neither as root nor parent)",
    }


# --- quality ------------------------------------------------------------------------
@dataclass
class MainMetric:
    name: str
    higher_is_better: bool
    baseline: float
    pruned: float
    drop: float  # worse-is-positive, in `unit`
    unit: str  # "points" (x100 of a fraction) or the metric's own unit
    rel_drop: float  # worse-is-positive fraction of the baseline

    def to_dict(self) -> dict:
        return asdict(self)


def main_metric(task: str, baseline: list[dict], pruned: list[dict]) -> MainMetric:
    name = MAIN_METRIC[task]
    by_name = {m["name"]: m for m in baseline}, {m["name"]: m for m in pruned}
    if name not in by_name[0] or name not in by_name[1]:
        raise DataError(f"the evaluation produced no {name!r} metric for this {task} model")
    base, new = by_name[0][name], by_name[1][name]
    worse = worse_than(base["higher_is_better"], base["value"], new["value"])
    return MainMetric(
        name=name,
        higher_is_better=base["higher_is_better"],
        baseline=base["value"],
        pruned=new["value"],
        drop=worse_by(name, base["higher_is_better"], base["value"], new["value"]),
        unit=drop_unit(name),
        rel_drop=_finite(worse / abs(base["value"])) if base["value"] else 0.0,
    )


def _finite(value: float) -> float:
    """A ratio of two huge (overflowed) metrics may be inf; JSON cannot hold it, a gate can."""
    return value if math.isfinite(value) else math.copysign(sys.float_info.max, value)


def evaluate_both(
    baseline: nn.Module, pruned: nn.Module, data: str | Path, batch_size: int, max_length: int
) -> tuple[list[dict], list[dict]]:
    """Metrics of both models on the same eval data (fidelity: cosine to the baseline)."""

    dataset = data_mod.read_data(data, pruned, max_length=max_length)
    objective = objectives.default_objective(pruned)
    if objective == "causal-lm" and info_of(pruned).tokenizer:  # perplexity and zero-shot word prediction
        starts = zero_shot.word_starts(pruned)
        base_lm = zero_shot.causal_lm_metrics(baseline, dataset, batch_size, starts)
        return metric_dicts(base_lm), metric_dicts(zero_shot.causal_lm_metrics(pruned, dataset, batch_size, starts))
    kwargs = {"batch_size": batch_size}
    base = objectives.evaluate(baseline, dataset, objective, reference=baseline, **kwargs)
    new = objectives.evaluate(pruned, dataset, objective, reference=baseline, **kwargs)
    return metric_dicts(base), metric_dicts(new)


# --- cost and speed ---------------------------------------------------------------
def model_facts(model: nn.Module, path: str | Path, sha: str, seq_len: int) -> dict:
    info = info_of(model)
    layout = info.layout
    return {
        "path": str(path),
        "sha256": sha,
        "family": info.family,
        "architecture": info.architecture,
        "layers": len(layout.layers),
        "original_layers": layout.num_layers,
        "heads": sum(len(h) for h in layout.heads),
        "original_heads": sum(layout.num_heads),
        "params": count_params(model),
        "flops_per_token": flops_per_token(model, seq_len),
    }


def measure_speed(
    baseline: nn.Module, pruned: nn.Module, batch: int, seq_len: int, threads: int, repeats: int, warmup: int
) -> dict:
    base_inputs, used = _on_device(baseline, *synthetic_inputs(baseline, batch, seq_len))
    pruned_inputs, _ = _on_device(pruned, *synthetic_inputs(pruned, batch, seq_len))
    timed = measure(
        {"baseline": baseline, "pruned": pruned},
        {"baseline": base_inputs, "pruned": pruned_inputs},
        repeats,
        warmup,
        threads,
    )
    return {
        "batch": batch,
        "seq_len": used,
        "threads": threads,
        "repeats": repeats,
        "warmup": warmup,
        "order": "interleaved, alternating",
        "latency_ms": {name: lat.to_dict() for name, lat in timed.items()},
        "speedup": timed["baseline"].median_ms / timed["pruned"].median_ms,
    }


# --- the head map -----------------------------------------------------------------
def head_map(baseline: ModelInfo, pruned: ModelInfo, scores=None) -> list[dict]:
    """Per original layer: heads the baseline had, heads that remain, their scores."""
    rows = []
    base_kept = dict(zip(baseline.layout.layers, baseline.layout.heads))
    new_kept = dict(zip(pruned.layout.layers, pruned.layout.heads))
    same_shape = baseline.layout.num_heads == pruned.layout.num_heads
    for layer, num in enumerate(pruned.layout.num_heads):
        before = base_kept.get(layer, []) if same_shape else list(range(num))
        after = new_kept.get(layer, [])
        layer_scores = None
        if scores is not None and layer in scores.heads:
            layer_scores = {str(h): float(v) for h, v in sorted(scores.heads[layer].items())}
        rows.append(
            {
                "layer": layer,
                "num_heads": num,
                "baseline": before,
                "kept": after,
                "removed": [h for h in before if h not in after],
                "layer_removed": layer not in new_kept and bool(before),
                "scores": layer_scores,
                **_ffn_row(pruned.layout, layer, layer in new_kept),
            }
        )
    return rows


def _ffn_row(layout, layer: int, kept: bool) -> dict:
    """The layer's FFN width, for a model whose FFN was cut (reports of head-only cuts keep their bytes)."""
    if not layout.ffn or not kept:
        return {}
    return {"ffn": {"kept": layout.ffn_width(layer), "of": layout.num_ffn[layer]}}


def check_scores(scores, pruned: ModelInfo, name: str) -> None:
    if list(scores.num_heads) != list(pruned.layout.num_heads):
        raise UsageError(
            f"{name}: scores are for a model with {scores.num_heads} heads per layer, "
            f"the pruned model has {pruned.layout.num_heads}"
        )


# --- gates --------------------------------------------------------------------------
@dataclass
class Gate:
    name: str  # the option that set it: max-drop, max-rel-drop, min-speedup
    description: str
    threshold: float
    value: float
    passed: bool

    def to_dict(self) -> dict:
        return asdict(self)


def gates(main: MainMetric, speedup: float | None, max_drop=None, max_rel_drop=None, min_speedup=None) -> list[Gate]:
    out = []
    if max_drop is not None:
        out.append(
            Gate(
                "max-drop", f"{main.name} drop <= {max_drop:g} {main.unit}", max_drop, main.drop, main.drop <= max_drop
            )
        )
    if max_rel_drop is not None:
        out.append(
            Gate(
                "max-rel-drop",
                f"{main.name} relative drop <= {max_rel_drop:.2%}",
                max_rel_drop,
                main.rel_drop,
                main.rel_drop <= max_rel_drop,
            )
        )
    if min_speedup is not None:
        if speedup is None:
            raise UsageError("--min-speedup needs latency measurements; do not pass --repeats 0")
        out.append(
            Gate("min-speedup", f"measured speedup >= {min_speedup:g}x", min_speedup, speedup, speedup >= min_speedup)
        )
    return out


def verdict(gate_list: list[Gate]) -> str:
    if not gate_list:
        return "no-gates"
    return "pass" if all(g.passed for g in gate_list) else "fail"


# --- the whole report -------------------------------------------------------------
def _on_device(model: nn.Module, inputs: dict, seq_len: int) -> tuple[dict, int]:
    device = input_device(model)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}, seq_len


DEFAULT_SEQ_LEN = 128


def build_report(pruned_path, baseline_arg, data, scores_path, opts: ReportSettings, warn=lambda message: None) -> dict:
    """Load, compare, measure and gate; returns the report artifact (a plain dict)."""
    with ExitStack() as cleanup:
        return _build(pruned_path, baseline_arg, data, scores_path, opts, warn, cleanup)


def _build(pruned_path, baseline_arg, data, scores_path, opts: ReportSettings, warn, cleanup: ExitStack) -> dict:

    baseline_path = resolve_baseline(pruned_path, baseline_arg)
    base_info, new_info = read_info(baseline_path), read_info(pruned_path)
    check_comparable(base_info, new_info)
    scores = None
    if scores_path is not None:
        scores, _ = read_artifact(scores_path, ("scores",))
        check_scores(scores, new_info, str(scores_path))
    check_device(opts.device, opts.dtype)
    python = None
    if opts.gguf is not None:  # refuse before the slow parts
        check_task(new_info)
        python = engine_python(None if opts.engine_python is None else Path(opts.engine_python))
    baseline, pruned = load(baseline_path), load(pruned_path)
    gen = serving.generation(
        baseline, opts.decode_batch, opts.decode_prompt, opts.decode_tokens
    )  # refuse before the slow parts
    for model in (baseline, pruned):
        place(model, opts.device, opts.dtype)
    base_sha, new_sha = info_of(baseline).source_sha, info_of(pruned).source_sha
    seq_len = opts.seq_len or min(DEFAULT_SEQ_LEN, max_sequence(baseline) or DEFAULT_SEQ_LEN)
    # `report --onnx` / `--gguf`: the shipped file stands in for the pruned model
    served, shipped = pruned, None
    if opts.onnx is not None:
        served, shipped = load_shipped(Path(opts.onnx), pruned, opts.threads)
    if opts.gguf is not None and python is not None:
        served, shipped = load_gguf(Path(opts.gguf), pruned, python, opts.threads, seq_len)
        cleanup.callback(served.close)  # llama.cpp's child process and its folder go, whatever happens
    table = None  # --latency: (path, artifact, sha256)
    if opts.latency is not None:
        table = (opts.latency, *read_table(opts.latency, baseline, base_sha))
    warnings = []
    family_tree = lineage(pruned_path, base_sha, new_sha)
    if not family_tree["descendant"]:
        warnings.append(
            f"{pruned_path} does not descend from the baseline {baseline_path}: "
            "the comparison is not a pruning comparison"
        )
        warn(warnings[-1])
    base_metrics, new_metrics = evaluate_both(baseline, served, data, opts.batch_size, seq_len)
    if shipped is not None:
        shipped["checkpoint_metrics"] = checkpoint_metrics(baseline, pruned, data, opts.batch_size, seq_len)
    main = main_metric(new_info.task, base_metrics, new_metrics)
    facts = {
        "baseline": model_facts(baseline, baseline_path, base_sha, seq_len),
        "pruned": model_facts(pruned, pruned_path, new_sha, seq_len),
    }
    predicted = facts["baseline"]["flops_per_token"] / facts["pruned"]["flops_per_token"]
    decode = serving.decode_prediction(baseline, pruned, gen) if gen else None
    measured = None
    if opts.repeats > 0:
        measured = measure_speed(baseline, served, opts.batch_size, seq_len, opts.threads, opts.repeats, opts.warmup)
        measured["speedup_vs_predicted"] = measured["speedup"] / predicted
        measured["decode"] = (
            serving.measure_decode(baseline, pruned, decode, opts.threads, opts.repeats, opts.warmup)
            if decode
            else None
        )
    latency = None
    if table is not None:
        latency = latency_section(*table, baseline, pruned, measured, predicted, opts.batch_size, seq_len, opts.threads)
    gate_list = gates(
        main, measured["speedup"] if measured is not None else None, opts.max_drop, opts.max_rel_drop, opts.min_speedup
    )
    inputs = [
        input_ref("baseline", baseline_path, base_sha),
        input_ref("pruned", pruned_path, new_sha),
        input_ref("data", data),
    ]
    if scores_path is not None:
        inputs.append(input_ref("scores", scores_path))
    if table is not None:
        inputs.append(input_ref("latency", table[0], table[2]))  # hashed once, by read_table
    if shipped is not None:
        shipped_file = opts.onnx or opts.gguf
        assert shipped_file is not None  # the shipped file is --onnx's or --gguf's
        inputs.append(input_ref("shipped", shipped_file, shipped["sha256"]))
    config = {}
    for key in CONFIG_KEYS:  # engine_python is where this machine keeps llama.cpp, not what was compared
        value = getattr(opts, key)
        if value is not None or key not in ("onnx", "gguf"):  # reports without them keep their bytes
            config[key] = str(value) if isinstance(value, Path) else value
    config["baseline"] = str(baseline_arg)
    return {
        **envelope("report", inputs, config),
        "task": new_info.task,
        "objective": _objective_name(pruned),
        "models": facts,
        "metrics": {"baseline": base_metrics, "pruned": new_metrics},
        "main_metric": main.to_dict(),
        "cost": {
            "seq_len": seq_len,
            "params_ratio": facts["pruned"]["params"] / facts["baseline"]["params"],
            "flops_ratio": facts["pruned"]["flops_per_token"] / facts["baseline"]["flops_per_token"],
            "predicted_speedup": predicted,
            "decode": decode,
            **({"latency": latency} if latency is not None else {}),
        },
        "kv_cache": serving.kv_section(baseline, pruned),
        "measured": measured,
        "head_map": head_map(base_info, new_info, scores),
        "lineage": family_tree,
        **({"shipped": shipped} if shipped is not None else {}),
        "warnings": warnings,
        "gates": [g.to_dict() for g in gate_list],
        "verdict": verdict(gate_list),
    }


def _objective_name(model: nn.Module) -> str:

    objective = objectives.default_objective(model)
    return str(getattr(objective, "name", objective))
