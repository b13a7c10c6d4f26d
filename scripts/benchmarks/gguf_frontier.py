"""Pruning that pays in llama.cpp: cuts at several FLOPs targets, each GGUF type, against
quantizing alone (BENCHMARKS.md, "Which engine").

    python -m scripts.benchmarks.gguf_frontier --model M.safetensors --calib calib.txt --heldout heldout.txt \\
        --work DIR [--targets 0.9,0.8,0.7,0.5] [--types f16,q8_0,q4_K_M,q4_0] [--score-rows 64] \\
        [--eval-rows 32] [--threads 2] [--repeats 3] --json out.json [--plot frontier.png]

Every cut runs through the CLI: `score --ffn --method fisher --objective causal-lm` on --calib
(once), then per target and grid `select --target-flops T [--runtime llama.cpp --gguf-type G]`
(G the type's quantization grid: q8_0 and q4_0 share the 32-grid, k-quants take 256; f16 has
none) -> `prune --data --calib` (lstsq) -> `export --gguf --gguf-type TYPE`; the unpruned model is
exported in every type too. llama.cpp (llama-cpp-python in its engine environment, where
headprune is not importable) then measures every file: perplexity on the first --eval-rows
held-out lines (128 tokens each, llama.cpp's own tokenizer, the same tokens for every file),
prefill tokens/s (a 128-token prompt in one batch) and decode tokens/s (--decode tokens, one at a
time), the best of --repeats rounds with the files interleaved within each round, so load on the
machine hits them alike. Predicted decode speedup: the bytes a decoded token reads (every tensor
but the token embedding, unless it is also the output head) of the unpruned file of the same type
over the cut's; measured / predicted says how much of it llama.cpp delivers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

GRIDS = {
    "f16": None,
    "f32": None,
    "q8_0": "q8_0",
    "q4_0": "q8_0",
    "q4_K_M": "q4_K_M",
    "q5_K_M": "q4_K_M",
    "q6_K": "q4_K_M",
}

ENGINE = r"""
import json, sys, time
import numpy as np
from llama_cpp import Llama

request = json.loads(sys.argv[1])
files, rows, threads = request["files"], request["rows"], request["threads"]
tokenizer = Llama(model_path=files[0], n_ctx=256, vocab_only=True, verbose=False)
ids = [tokenizer.tokenize(text.encode("utf-8"), add_bos=True, special=False)[:128] for text in rows]
ids = [row for row in ids if len(row) >= 16]
prompt = max(ids, key=len)

def load(path, logits_all=False):
    return Llama(model_path=path, n_ctx=256, n_batch=256, n_threads=threads, n_threads_batch=threads,
                 logits_all=logits_all, verbose=False)

out = {}
for path in files:
    llm = load(path, logits_all=True)
    nll, count = 0.0, 0
    for row in ids:
        llm.reset()
        llm.eval(row)
        logits = np.asarray(llm.scores[: len(row) - 1], dtype=np.float64)
        top = logits.max(-1, keepdims=True)
        logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        nll -= logp[np.arange(len(row) - 1), row[1:]].sum()
        count += len(row) - 1
    out[path] = {"perplexity": float(np.exp(nll / count)), "tokens": count, "prefill": [], "decode": []}
    del llm
for _ in range(request["repeats"]):
    for path in files:
        llm = load(path)
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        out[path]["prefill"].append(len(prompt) / (time.perf_counter() - start))
        token = int(np.argmax(llm.scores[len(prompt) - 1]))
        start = time.perf_counter()
        for _ in range(request["decode"]):
            llm.eval([token])
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out[path]["decode"].append(request["decode"] / (time.perf_counter() - start))
        del llm
print(json.dumps(out))
"""


def headprune(*args: object) -> None:
    command = [sys.executable, "-m", "headprune_cli", *map(str, args)]
    print("$ headprune " + " ".join(map(str, args)), file=sys.stderr, flush=True)
    subprocess.run(command, check=True)


def read_bytes(path: Path) -> int:
    """Bytes a decoded token reads: every tensor, but the token embedding when an output head exists
    (one embedding row is gathered; a tied embedding is the output head and is read whole)."""
    import gguf

    tensors = gguf.GGUFReader(path).tensors
    names = {t.name for t in tensors}
    return sum(int(t.n_bytes) for t in tensors if not (t.name == "token_embd.weight" and "output.weight" in names))


def make_files(args: argparse.Namespace) -> dict[tuple[str, str], Path]:
    """(cut, type) -> GGUF file; cut 'unpruned' or the FLOPs target."""
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    scores = work / "scores.json"
    if not scores.exists():
        scoring = ["--objective", "causal-lm", "--method", "fisher", "--ffn", "--samples", args.score_rows]
        headprune(
            "score", args.model, "--data", args.calib, *scoring, "--max-length", 128, "--batch-size", 4, "-o", scores
        )
    files = {}
    for kind in args.types:
        out = work / f"unpruned-{kind}.gguf"
        if not out.exists():
            headprune("export", args.model, "--gguf", out, "--gguf-type", kind)
        files[("unpruned", kind)] = out
    for target in args.targets:
        for kind in args.types:
            grid = GRIDS[kind]
            cut = work / f"cut-{target}-{grid or 'free'}.safetensors"
            if not cut.exists():
                plan = cut.with_suffix(".json")
                extra = ["--runtime", "llama.cpp", "--gguf-type", grid] if grid else []
                headprune("select", scores, "--target-flops", target, *extra, "-o", plan)
                headprune("prune", "--plan", plan, "--data", args.calib, "--max-length", 128, "-o", cut)
            out = work / f"cut-{target}-{kind}.gguf"
            if not out.exists():
                headprune("export", cut, "--gguf", out, "--gguf-type", kind)
            files[(str(target), kind)] = out
    return files


def measure(args: argparse.Namespace, files: dict) -> list[dict]:
    rows = [line for line in args.heldout.read_text(encoding="utf-8").splitlines() if line.strip()][: args.eval_rows]
    request = {"files": [str(p) for p in files.values()], "rows": rows, "threads": args.threads,
               "repeats": args.repeats, "decode": args.decode}  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([args.engine, "-c", ENGINE, json.dumps(request)], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"llama.cpp run failed:\n{done.stderr[-2000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    table = []
    for (cut, kind), path in files.items():
        m = found[str(path)]
        table.append({"cut": cut, "type": kind, "file_mb": path.stat().st_size / 1e6, "bytes_read": read_bytes(path),
                      "perplexity": m["perplexity"], "tokens": m["tokens"], "prefill_tok_s": max(m["prefill"]),
                      "decode_tok_s": max(m["decode"])})  # fmt: skip
    for row in table:
        base = next(r for r in table if r["cut"] == "unpruned" and r["type"] == row["type"])
        row["decode_speedup"] = row["decode_tok_s"] / base["decode_tok_s"]
        row["predicted_decode"] = base["bytes_read"] / row["bytes_read"]
        row["prefill_speedup"] = row["prefill_tok_s"] / base["prefill_tok_s"]
    return table


def markdown(table: list[dict]) -> str:
    f16 = {r["cut"]: r for r in table if r["type"] == "f16"}.get("unpruned")
    lines = [
        "| cut (FLOPs kept) | type | file MB | perplexity | prefill tok/s | decode tok/s | decode vs unpruned, same "
        "type (predicted, measured/predicted) | decode vs unpruned f16 |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in table:
        against = f"{r['decode_tok_s'] / f16['decode_tok_s']:.2f}x" if f16 else "-"
        lines.append(
            f"| {r['cut']} | {r['type']} | {r['file_mb']:.1f} | {r['perplexity']:.2f} | {r['prefill_tok_s']:.0f} | "
            f"{r['decode_tok_s']:.1f} | {r['decode_speedup']:.2f}x ({r['predicted_decode']:.2f}x, "
            f"{r['decode_speedup'] / r['predicted_decode']:.2f}) | {against} |"
        )
    return "\n".join(lines)


def plot(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    alone = [r for r in table if r["cut"] == "unpruned"]
    ax.plot(
        [r["decode_tok_s"] for r in alone],
        [r["perplexity"] for r in alone],
        "o-",
        color="black",
        label="quantize alone",
    )
    for r in alone:
        ax.annotate(r["type"], (r["decode_tok_s"], r["perplexity"]), fontsize=8)
    for kind in sorted({r["type"] for r in table}):
        cuts = [r for r in table if r["type"] == kind and r["cut"] != "unpruned"]
        ax.plot([r["decode_tok_s"] for r in cuts], [r["perplexity"] for r in cuts], "s--", label=f"prune + {kind}")
        for r in cuts:
            ax.annotate(r["cut"], (r["decode_tok_s"], r["perplexity"]), fontsize=7)
    ax.set_xlabel("decode tokens/s (llama.cpp)")
    ax.set_ylabel("held-out perplexity")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--calib", type=Path, required=True)
    parser.add_argument("--heldout", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--targets", default="0.9,0.8,0.7,0.5")
    parser.add_argument("--types", default="f16,q8_0,q4_K_M,q4_0")
    parser.add_argument("--score-rows", type=int, default=64)
    parser.add_argument("--eval-rows", type=int, default=32)
    parser.add_argument("--decode", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--engine",
        default=os.path.join(os.environ.get("HEADPRUNE_LLAMA_CPP_ENV", ".engines/llama-cpp"), "bin", "python"),
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)
    args.targets = [float(t) for t in args.targets.split(",")]
    args.types = args.types.split(",")
    unknown = [t for t in args.types if t not in GRIDS]
    if unknown:
        parser.error(f"unknown types {unknown}; known: {', '.join(GRIDS)}")
    table = measure(args, make_files(args))
    print(markdown(table))
    if args.json:
        args.json.write_text(json.dumps({"rows": table, "args": {k: str(v) for k, v in vars(args).items()}}, indent=2))
    if args.plot:
        plot(table, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
