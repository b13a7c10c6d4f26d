"""`report --latency TABLE`: the latency table's prediction beside the measured speedup.

The table is the baseline's (`profile` of the unpruned model). Its prediction of each
model is the interpolated sum over the layers each keeps (model/latency_table.py). A
table measured elsewhere (another device, thread count, batch, sequence length or dtype)
predicts another machine's speed: the report then says so in one line and compares
nothing.
"""

from __future__ import annotations

from torch import nn

from headprune_cli.artifacts.schema import Envelope, read_artifact
from headprune_cli.errors import UsageError
from headprune_cli.model.latency_table import LatencyTable
from headprune_cli.runtime.device import input_device, stored_dtype_name
from headprune_cli.stages.profile.build import device_facts, layout_counts
from headprune_cli.stages.select.latency import check_belongs


def setting_of(model: nn.Module, batch: int, seq_len: int, threads: int) -> dict:

    device = device_facts(input_device(model))
    dtype = stored_dtype_name(model)
    return {
        "device": device["name"],
        "threads": threads if device["type"] == "cpu" else None,
        "batch": batch,
        "seq_len": seq_len,
        "dtype": dtype,
    }


def differences(artifact, here: dict) -> list[str]:
    table = {
        "device": artifact.device.name,
        "threads": artifact.threads if artifact.device.type == "cpu" else None,
        "batch": artifact.batch,
        "seq_len": artifact.seq_len,
        "dtype": artifact.dtype,
    }
    return [f"{key} {table[key]} (table) vs {here[key]} (report)" for key in table if table[key] != here[key]]


def read_table(path, baseline: nn.Module, base_sha: str) -> tuple[Envelope, str]:
    """(artifact, sha256) of the baseline's latency table, refused when it is another model's:
    checked before the report evaluates anything."""

    artifact, sha = read_artifact(path, ("latency",))
    heads, widths = layout_counts(baseline)
    check_belongs(artifact, base_sha, {"heads": heads, "ffn": widths}, f"{path} (the baseline's latency table)")
    return artifact, sha


def latency_section(
    path,
    artifact,
    sha: str,
    baseline: nn.Module,
    pruned: nn.Module,
    measured: dict | None,
    flops_speedup: float,
    batch: int,
    seq_len: int,
    threads: int,
) -> dict:
    """The report's `cost.latency`."""
    heads, widths = layout_counts(baseline)
    section = {"table": str(path), "sha256": sha, "device": artifact.device.name}
    mismatch = differences(artifact, setting_of(baseline, batch, seq_len, threads))
    if mismatch:
        return {
            **section,
            "comparable": False,
            "reason": "the table was profiled in another setting: " + "; ".join(mismatch),
        }
    table = LatencyTable.from_artifact(artifact)
    new_heads, new_widths = layout_counts(pruned)
    unknown = sorted(set(new_heads) - set(heads))
    if unknown or any(new_heads[l] > heads[l] or new_widths[l] > widths[l] for l in new_heads):
        raise UsageError(
            f"{path}: the pruned model is not a pruning of the profiled baseline (layers or widths it does not have)"
        )
    base_ms, new_ms = table.predict_ms(heads, widths), table.predict_ms(new_heads, new_widths)
    section.update(
        comparable=True,
        reason=None,
        predicted_ms={"baseline": base_ms, "pruned": new_ms},
        predicted_speedup=base_ms / new_ms,
        flops_predicted_speedup=flops_speedup,
        measured_speedup=None,
        latency_error=None,
        flops_error=None,
    )
    if measured:
        speedup = measured["speedup"]
        section.update(
            measured_speedup=speedup,
            latency_error=section["predicted_speedup"] / speedup - 1,
            flops_error=flops_speedup / speedup - 1,
        )
    return section


def markdown_line(section: dict) -> str:
    """One sentence for the Markdown summary (of a report that has `cost.latency`)."""
    if not section["comparable"]:
        return f"Latency table `{section['table']}` not compared: {section['reason']}."
    text = f"Latency table ({section['device']}): predicted speedup **{section['predicted_speedup']:.2f}x**"
    if section["measured_speedup"] is None:
        return text + " (latency not measured)."
    return (
        text + f", measured {section['measured_speedup']:.2f}x: the table was off by {section['latency_error']:+.1%}, "
        f"the FLOPs prediction ({section['flops_predicted_speedup']:.2f}x) by {section['flops_error']:+.1%}."
    )
