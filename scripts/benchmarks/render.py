"""The suite's blocks of BENCHMARKS.md from one scripts/benchmarks/suite.py run: tables, target verdicts,
which method to pick.

Everything here is derived from the measurements in `result`; verdicts and the method
advice are computed, so a rerun rewrites them from its own numbers. Each block sits in
BENCHMARKS.md between `<!-- suite: NAME -->` and `<!-- /suite: NAME -->` under the question
it answers; `splice` replaces one block in place and leaves the rest of the file as it was.
"""

from __future__ import annotations

from . import decode as bench_decode
from . import peer as bench_peer
from . import quality as bench_quality
from . import recovery as bench_recovery
from . import speed as bench_speed


def _verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def header(r: dict) -> list[str]:
    """The run's own facts: command, machine, date, load (the `run` block)."""
    m = r["machine"]
    load = f"load average {r['load_before']} before, {r['load_after']} after (1/5/15 min)"
    busy = (
        max(float(x) for x in (r["load_before"] + " " + r["load_after"]).split() if x != "n/a")
        if "n/a" not in r["load_before"]
        else 0
    )
    lines = [
        f"- command: `{r['command']}` (mode: {r['mode']})",
        f"- machine: {m['cores']} cores, {m['cpu']}; torch {m['torch']}, transformers {m['transformers']}, "
        f"Python {m['python']}; {m['threads']} torch threads, OMP_NUM_THREADS={m['OMP_NUM_THREADS']}",
        f"- date: {r['date']}; section seconds: " + ", ".join(f"{k} {v}" for k, v in r["seconds"].items()),
        f"- {load}",
    ]
    if busy > 2.5:
        lines.append(
            f"- note: the machine was shared (load up to {busy:.1f} on {m['cores']} cores); latencies are "
            "noisier than on a quiet machine, but each ratio's two sides ran interleaved under the same load."
        )
    return lines + [""]


def score_section(s: dict) -> list[str]:
    return [
        "### Scoring cost",
        "",
        f"`score --method taylor` vs a plain forward+backward (every weight gradient) over the same batches, "
        f"{s['model']}, {s['examples']} texts (first lines of examples/minilm_text.txt, up to {s['tokens']} tokens), "
        f"batch {s['batch']}, median of {s['repeats']} interleaved runs.",
        "",
        "| score taylor (s) | forward+backward (s) | ratio | target |",
        "|---:|---:|---:|---|",
        f"| {s['score_s']:.3f} | {s['plain_s']:.3f} | {s['ratio']:.3f} | <= 1.2: {_verdict(s['ratio'] <= 1.2)} |",
        "",
    ]


def speed_section(rows: list[dict]) -> list[str]:
    lines = [
        "### Speed: measured vs FLOP-predicted",
        "",
        "The last 25/50/75% of each layer's heads removed (whole key/value groups for GQA); baseline and pruned "
        "copies timed interleaved in one loop. Predicted = ratio of analytic FLOPs per token. GPT-2 and LLaMA shapes "
        "are built from configs with random weights (speed does not depend on values).",
        "",
        bench_speed.HEADER,
        *map(bench_speed.markdown_row, rows),
        "",
    ]
    missed = [r for r in rows if r["ratio"] < 0.95]
    lines.append(
        f"Target measured/predicted >= 0.95: {_verdict(not missed)} "
        f"({len(rows) - len(missed)} of {len(rows)} rows reach it)."
    )
    if missed:
        worst = min(missed, key=lambda r: r["ratio"])
        lines.append(
            f"Missed on: {'; '.join(r['model'] + ' ' + r['removed'] for r in missed)} (worst {worst['ratio']:.3f}). "
            "Likely reasons: the FLOP model counts multiply-adds only, while softmax, layer norms, GELU/SiLU, "
            "reshapes and framework overhead per op do not shrink with the head count, so they take a growing "
            "share of the pruned model's time; narrower matrices also run at a lower fraction of peak on CPU. "
            "The deeper the cut, the larger the gap. Shared-machine noise adds to it (see the load above)."
        )
    return lines + [""]


def quality_section(q: dict) -> list[str]:
    ratios = [float(x) for x in q["ratios"]]
    order = [m for m in bench_quality.METHODS if m in q["rows"]] + sorted(set(q["rows"]) - set(bench_quality.METHODS))
    rows = {m: {float(r): tuple(q["rows"][m][r]) for r in q["rows"][m]} for m in order}
    lines = [
        "### Fidelity per importance method (all-MiniLM-L6-v2)",
        "",
        f"Mean cosine of pooled embeddings to the unpruned model on {q['held_out']} held-out texts; scores and "
        f"lstsq calibration on the {q['calibration']} texts before them (examples/minilm_text.txt, "
        f"max {q['max_length']} tokens). "
        "Selection `global`, min 1 head per layer. 1.0 = identical.",
        "",
        bench_quality.markdown(rows, ratios, q["seeds"]),
        "",
    ]
    random = rows.get("random")
    others = {m: v for m, v in rows.items() if m != "random"}
    for r in ratios:
        best = max(others, key=lambda m: others[m][r][0])
        margin = others[best][r][0] - random[r][0]
        lines.append(
            f"- {r:.0%} removed: best method `{best}` {others[best][r][0]:.4f} vs random {random[r][0]:.4f} "
            f"(+{margin:.4f}); target 'beats random clearly' (>= 0.01): {_verdict(margin >= 0.01)}."
        )
    worse = [(m, r) for m, by in rows.items() for r in ratios if by[r][1] <= by[r][0]]
    lines.append(
        "- lstsq improves every method at every ratio: "
        + _verdict(not worse)
        + (
            ""
            if not worse
            else " (not on " + ", ".join(f"{m} at {r:.0%}" for m, r in worse) + "; "
            "lstsq fits each layer's attention output on the calibration texts, so with few calibration texts it can "
            "overfit them, and a better layer-local fit need not give a better final embedding)"
        )
        + "."
    )
    seconds = q.get("score_seconds", {})
    if seconds:
        lines.append(
            "- scoring time per method (s, one run on the calibration set): "
            + ", ".join(f"{m} {t:.1f}" for m, t in seconds.items())
            + "."
        )
    return lines + [""] + pick_method(rows, ratios, seconds)


def pick_method(rows: dict, ratios: list[float], seconds: dict) -> list[str]:
    """Advice computed from the table: rank by fidelity at the largest ratio, with lstsq."""
    r = max(ratios)
    others = {m: v for m, v in rows.items() if m != "random"}
    ranked = sorted(others, key=lambda m: others[m][r][1], reverse=True)
    best, second = ranked[0], ranked[1]
    cheap = [m for m in ranked if m != "loo"]
    text = (
        f"**Which method to pick (from the table above).** At {r:.0%} removed with lstsq the ranking is "
        + ", ".join(f"`{m}` {others[m][r][1]:.4f}" for m in ranked)
        + f" (random {rows['random'][r][1]:.4f}). "
    )
    if best == "loo" and cheap:
        text += (
            f"`loo` is best but needs one masked forward per head ({seconds.get('loo', float('nan')):.1f} s here vs "
            f"{seconds.get(cheap[0], float('nan')):.1f} s for `{cheap[0]}`); `{cheap[0]}` is the best one-pass choice. "
        )
    else:
        text += f"Use `{best}` (one forward+backward); `{second}` is the runner-up. "
    gain = sum(by[r][1] - by[r][0] for by in rows.values()) / len(rows)
    text += (
        f"With calibration text at hand, `--compensate lstsq` changed fidelity by {gain:+.4f} on average at {r:.0%}"
        + (" (add it)." if gain > 0 else " (it did not help here).")
        + " "
    )
    spread = others[best][r][0] - min(v[r][0] for v in others.values())
    lead = min(v[r][0] for v in others.values()) - rows["random"][r][0]
    text += (
        f"Without compensation, every scored method beats random by at least {lead:+.4f} and the scored methods "
        f"lie within {spread:.4f} of each other"
        + (", so the method matters less than scoring at all." if lead > spread else ".")
    )
    return [text, ""]


def recovery_section(rec: dict) -> list[str]:
    rows = rec["rows"]
    base = rows[0]["accuracy"]
    recovered = [x for x in rows if x["model"].startswith("recovered")]
    best = max(recovered, key=lambda x: x["accuracy"])
    gap = (base - best["accuracy"]) * 100
    lines = [
        "### Recovery on the bundled example",
        "",
        "examples/demo (reference encoder, 4 layers x 4 heads): 40% of heads removed by `taylor`, then recovered "
        "with the default `finetune` settings (final weights, no best-epoch choice). Dev accuracy (500 rows).",
        "",
        bench_recovery.markdown(rows),
        "",
        f"Target within 0.5 points of the baseline after recovery: {_verdict(gap <= 0.5)} (best: "
        f"{best['model'].split(',')[0]}, "
        f"{-gap:+.2f} points).",
    ]
    if gap > 0.5:
        lines.append(
            "Likely reason: with 40% of 16 heads gone the small model has lost capacity the short default "
            "recovery does not rebuild; more epochs, KD, or iterative pruning narrow the gap."
        )
    if rec.get("stress"):
        lines += [
            "",
            "The same at 75% of heads removed (a deeper cut than the target asks for), to show what "
            "recovery wins back when pruning does cost accuracy:",
            "",
            bench_recovery.markdown(rec["stress"]),
        ]
    return lines + [""]


def pipeline_section(rows: list[dict], fresh: dict | None = None) -> list[str]:
    lines = [
        "### Pipeline wall time",
        "",
        "`headprune run` in a fresh process (import, every stage, report), `--force` so that no stage is skipped.",
        "",
        "| pipeline | command | runs | wall time (s, median) |",
        "|---|---|---:|---:|",
    ]
    lines += [f"| {r['pipeline']} | `{r['command']}` | {r['runs']} | {r['seconds']:.1f} |" for r in rows]
    if fresh:  # --fresh-clone: the README's first command on a clone without .venv
        lines.append(
            f"| bundled example from a fresh clone, no .venv (creates it, installs, runs, prints the report) "
            f"| `bash scripts/demo.sh` | 1 | {fresh['seconds']:.1f} |"
        )
    return lines + [""]


def peer_section(p: dict) -> list[str]:
    s = p["setting"]
    rows = {x["model"]: x for x in p["rows"]}
    lines = [
        "### Against Torch-Pruning on all-MiniLM-L6-v2",
        "",
        f"Ran as: {p['ran_with']}. Same model, same calibration texts, same loss, same number of heads removed "
        "(a peer row with another count is refused). Torch-Pruning: MetaPruner + TaylorImportance, global head "
        "pruning as in its examples/transformers/prune_hf_bert.py; it has no compensation step.",
        "",
    ]
    table = bench_peer.markdown(p).split("\n\n")
    lines += [table[0], "", table[1], ""]
    if not s.get("peer"):
        lines.append("No peer row in this run (run with `--peer-python` pointing at a venv with torch-pruning).")
    elif s.get("peer_refused"):
        lines.append(f"Peer row refused: {s['peer_refused']}.")
    elif "torch-pruning taylor" in rows:
        tp, hp = rows["torch-pruning taylor"], rows["headprune taylor"]
        lines.append(
            f"At {hp['heads_removed']}/{hp['heads_total']} heads removed: fidelity headprune {hp['fidelity']:.4f} "
            f"(+lstsq {rows['headprune taylor + lstsq']['fidelity']:.4f}) vs Torch-Pruning {tp['fidelity']:.4f}; "
            f"measured speedup {hp['speedup']:.2f}x vs {tp['speedup']:.2f}x (the same FLOPs when the same count is "
            "removed, so speed differs only by where the heads go). Reload: Torch-Pruning's output via "
            f"`save_pretrained`/`from_pretrained`: {tp['reloads']}"
            + (" (its config still states the original head count);" if tp["reloads"].startswith("no") else ";")
            + f" headprune's checkpoint records its layout: {hp['reloads']}."
        )
    return lines + [""]


def onnx_section(p: dict) -> list[str]:
    s = p["setting"]
    lines = [
        "### onnxruntime latency",
        "",
        f"`export_onnx` of the baseline and the headprune taylor + lstsq model ({s['ratio']:.0%} of heads removed), "
        f"CPUExecutionProvider, {s['threads']} intra-op threads, batch {s['batch']} x seq {s['seq_len']}, "
        f"median of {s['repeats']} interleaved runs.",
        "",
        "| model | median ms | speedup |",
        "|---|---:|---:|",
    ]
    order = sorted(p["onnxruntime"].items(), key=lambda kv: kv[0] != "unpruned")  # the baseline first
    lines += [f"| {k} | {v['median_ms']:.1f} | {v['speedup']:.2f}x |" for k, v in order]
    return lines + [""]


DECODE_HEADING = "### Serving a causal LM: KV cache, prefill and decode"


def decode_section(d: dict, alone: dict | None = None) -> list[str]:
    """`alone`: the run's command, date, machine and load, when this section was measured by itself."""
    lines = [
        DECODE_HEADING,
        "",
        "Removing whole key/value groups shrinks the KV cache, which every decode step reads; a forward pass "
        "without the cache (the speed table) cannot show it. Predictions are what `headprune report` prints for a "
        "causal "
        "LM: KV bytes per token from the layout (checked against the bytes transformers' cache holds after the "
        "prefill, in brackets); prefill = ratio of FLOPs of the prompt; decode = ratio of bytes read per generated "
        "token (linear weights once per step, shared by the batch, plus 3 passes over the sequence's KV cache: "
        "`DynamicCache` appends with `torch.cat`, and attention reads it). The last column is what FLOPs alone "
        "would predict for decode.",
        "",
    ]
    if alone:
        lines += [
            f"- measured alone: `{alone['command']}`, {alone['date']}, {alone['machine']['cores']} cores, "
            f"{alone['machine']['cpu']}, torch {alone['machine']['torch']}; load average {alone['load_before']} "
            f"before, {alone['load_after']} after",
            "",
        ]
    lines += bench_decode.markdown(d)
    for r in d["rows"]:
        prefill = f"{r['measured_prefill'] / r['predicted_prefill']:.2f}" if r["measured_prefill"] else "not timed"
        lines.append(
            f"- batch {r['batch']}: measured/predicted prefill {prefill}, "
            f"decode {r['measured_decode'] / r['predicted_decode']:.2f} (FLOPs alone: "
            f"{r['measured_decode'] / r['decode_flops_speedup']:.2f})."
        )
    return lines + [""]


def blocks(r: dict) -> dict[str, list[str]]:
    """Every block this run measured, by its marker name, in document order."""
    out = {"run": header(r)}
    if "score" in r:
        out["score"] = score_section(r["score"])
    if "speed" in r:
        out["speed"] = speed_section(r["speed"])
    if "quality" in r:
        out["quality"] = quality_section(r["quality"])
    if "recovery" in r:
        out["recovery"] = recovery_section(r["recovery"])
    if "pipeline" in r:
        out["pipeline"] = pipeline_section(r["pipeline"], r.get("fresh_clone"))
    if "peer" in r:
        out["peer"] = peer_section(r["peer"])
        out["onnx"] = onnx_section(r["peer"])
    if "decode" in r:
        out["decode"] = decode_section(r["decode"])
    return out


def render(r: dict) -> str:
    """A document of this run alone (no BENCHMARKS.md to splice into: --quick, a new --out)."""
    text = "# headprune benchmarks: one suite run\n"
    for name, lines in blocks(r).items():
        text = splice(text, name, lines)
    return text


def opening(name: str) -> str:
    return f"<!-- suite: {name} -->"


def closing(name: str) -> str:
    return f"<!-- /suite: {name} -->"


def splice(text: str, name: str, lines: list[str]) -> str:
    """`text` with block `name` replaced in place (appended at the end when `text` has none)."""
    block = opening(name) + "\n" + "\n".join(lines).rstrip() + "\n" + closing(name) + "\n"
    start, end = text.find(opening(name)), text.find(closing(name))
    if start < 0 or end < start:
        return text.rstrip() + "\n\n" + block
    return text[:start] + block + text[end + len(closing(name)) + 1 :]
