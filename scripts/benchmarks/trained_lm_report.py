"""Markdown for BENCHMARKS.md from scripts/benchmarks/trained_lm.py's result."""

from __future__ import annotations


def markdown(result: dict) -> str:
    base_ppl, base_params = result["baseline_perplexity"], result["baseline_parameters"]
    lines = [
        f"Baseline: {base_params:,} parameters, perplexity **{base_ppl:.2f}** on the first {result['eval_docs']} "
        "held-out documents (unigram baseline on the whole held-out split: "
        f"{result['model']['unigram_perplexity']:.1f}).",
        "",
        "| section | cut | params removed | perplexity | vs unpruned | command(s) |",
        "|---|---|---:|---:|---:|---|",
    ]
    for row in result["rows"]:
        removed = 1 - row["parameters"] / base_params
        extra = f" (before: {row['extra']['before']:.2f})" if "before" in row["extra"] else ""
        commands = "<br>".join(f"`{c}`" for c in row["commands"])
        lines.append(
            f"| {row['section']} | {row['label']} | {removed:.1%} | {row['perplexity']:.2f}{extra} | "
            f"{row['perplexity'] / base_ppl - 1:+.1%} | {commands} |"
        )
    if result["decode"]:
        lines += [
            "",
            "| cut (uniform, exported) | batch | decode tokens/s baseline / pruned | speedup predicted / measured |",
            "|---|---:|---|---|",
        ]
        for d in result["decode"]:
            tps = d["tokens_per_s"]
            lines.append(
                f"| {d['label']} | {d['batch']} | {tps['baseline']:.1f} / {tps['pruned']:.1f} | "
                f"{d['predicted_decode']:.2f}x / **{d['decode_speedup']:.2f}x** |"
            )
    for failure in result.get("failures", []):
        lines.append(f"- refused: {failure}")
    lines += ["", f"Benchmark wall time {result['seconds']:.0f} s; load average after {result['load_after']}."]
    return "\n".join(lines)
