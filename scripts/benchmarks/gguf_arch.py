"""llama.cpp's `llama` graph against its `deci` graph of the same weights, and the output head's
share of decode (BENCHMARKS.md, "Which engine"; the rule `export --gguf` picks the graph by).

    python -m scripts.benchmarks.gguf_arch --model M.safetensors --scores scores.json --work DIR \\
        [--target 0.8] [--types f16,q8_0] [--vocab 1024] [--threads 2] [--repeats 5] [--json out.json]

Files, all by headprune's public API (`export_gguf(..., arch=)`): the unpruned model and a
uniform cut (`select --target-flops T --uniform --runtime llama.cpp --gguf-type q8_0` -> `prune`,
no compensation: speed does not depend on it), each written as `llama` and as `deci`, at every
--types. The head's share: the unpruned `llama` file again with its vocabulary cut to --vocab
tokens (the embedding/output rows and the tokenizer's tokens and merges), so the output head
reads --vocab rows instead of all of them and nothing else changes.

llama-cpp-python in the engine environment loads every file once, reports llama.cpp's graph
(nodes and splits from its log: in this build the log does not reach the capture and they read
None, so the table leaves them out), then times rounds with the files interleaved, so load on
the machine hits them alike: a --prompt-token prefill in one batch and --decode single-token
steps on fixed token ids (below --vocab, valid in every file), wall time around llama-cpp-python's
eval (its perf counters read zero in this build). Best of --repeats, after a warm-up round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import headprune_cli

ENGINE = r"""
import contextlib, io, json, re, sys, time
from llama_cpp import Llama

request = json.loads(sys.argv[1])
files, threads, prompt_n, decode_n = request["files"], request["threads"], request["prompt"], request["decode"]
ids = [100 + (37 * i) % (request["vocab"] - 100) for i in range(prompt_n + decode_n)]

def graph(path):
    # Verbose, llama-cpp-python passes llama.cpp's log ("graph nodes  = N", "graph splits = N") to sys.stderr.
    log = io.StringIO()
    with contextlib.redirect_stderr(log):
        llm = Llama(model_path=path, n_ctx=prompt_n + decode_n + 8, n_batch=prompt_n, n_threads=threads,
                    n_threads_batch=threads, verbose=True)
    text = log.getvalue()
    found = {k: [int(v) for v in re.findall(k + r"\s*=\s*(\d+)", text)] for k in ("graph nodes", "graph splits")}
    return llm, {k.split()[1]: v[-1] if v else None for k, v in found.items()}

out, models = {}, {}
for path in files:
    models[path], out[path] = graph(path)
    out[path].update(prefill=[], decode=[])
for round in range(request["repeats"] + 1):  # round 0 pages the weights in and is dropped
    for path in files:
        llm = models[path]
        llm.reset()
        start = time.perf_counter()
        llm.eval(ids[:prompt_n])
        mid = time.perf_counter()
        for token in ids[prompt_n:]:
            llm.eval([token])
        end = time.perf_counter()
        if round:
            out[path]["prefill"].append(prompt_n / (mid - start))
            out[path]["decode"].append(decode_n / (end - mid))
print(json.dumps(out))
"""


def headprune(*args: object) -> None:
    print("$ headprune " + " ".join(map(str, args)), file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "headprune_cli", *map(str, args)], check=True)


def uniform_cut(args: argparse.Namespace) -> Path:
    cut = args.work / f"uniform-{args.target}.safetensors"
    if not cut.exists():
        plan = cut.with_suffix(".json")
        grid = ["--runtime", "llama.cpp", "--gguf-type", "q8_0"]
        headprune("select", args.scores, "--target-flops", args.target, "--uniform", *grid, "-o", plan)
        headprune("prune", "--plan", plan, "-o", cut)
    return cut


def small_vocab(source: Path, target: Path, keep: int) -> None:
    """`source` with only its first `keep` tokens: the embedding (and output) rows, the token list
    and types, and the merges whose parts and result are all kept. Everything else is copied."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = reader.get_field("general.architecture").contents()
    kept = set(reader.get_field("tokenizer.ggml.tokens").contents()[:keep])
    writer = gguf.GGUFWriter(target, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        if name in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            value = value[:keep]
        elif name == "tokenizer.ggml.merges":
            value = [m for m in value if _kept_merge(m, kept)]
        elif name == f"{arch}.vocab_size":
            value = keep
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, field.types[0], sub)
    for t in reader.tensors:
        data = t.data[:keep] if t.name in ("token_embd.weight", "output.weight") else t.data
        writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _kept_merge(merge: str, kept: set[str]) -> bool:
    left, right = merge.split(" ", 1)
    return left in kept and right in kept and left + right in kept


def make_files(args: argparse.Namespace) -> list[dict]:
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for cut, checkpoint in (("unpruned", args.model), (f"uniform {args.target}", uniform_cut(args))):
        for kind in args.types:
            for arch in ("llama", "deci"):
                path = args.work / f"{cut.split()[0]}-{arch}-{kind}.gguf"
                if not path.exists():
                    headprune_cli.export_gguf(checkpoint, path, kind, arch=arch)
                rows.append({"cut": cut, "type": kind, "arch": arch, "vocab": "all", "path": path})
    for kind in args.types:
        path = args.work / f"unpruned-llama-{kind}-vocab{args.vocab}.gguf"
        if not path.exists():
            small_vocab(args.work / f"unpruned-llama-{kind}.gguf", path, args.vocab)
        rows.append({"cut": "unpruned", "type": kind, "arch": "llama", "vocab": str(args.vocab), "path": path})
    return rows


def measure(args: argparse.Namespace, rows: list[dict]) -> None:
    request = {"files": [str(r["path"]) for r in rows], "threads": args.threads, "repeats": args.repeats,
               "prompt": args.prompt, "decode": args.decode, "vocab": args.vocab}  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([args.engine, "-c", ENGINE, json.dumps(request)], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"llama.cpp run failed:\n{done.stderr[-2000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for r in rows:
        m = found[str(r["path"])]
        r.update(nodes=m["nodes"], splits=m["splits"], prefill_tok_s=max(m["prefill"]), decode_tok_s=max(m["decode"]))
        r["bytes_read"] = headprune_cli.gguf_decode_bytes(r["path"], args.prompt + args.decode / 2)["total"]
        r["file_mb"] = r["path"].stat().st_size / 1e6


def markdown(rows: list[dict]) -> str:
    lines = [
        "| weights | type | graph | vocab | MB read / token | prefill tok/s | decode tok/s "
        "| decode vs llama, same weights |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        base = next(
            b for b in rows if (b["cut"], b["type"], b["arch"], b["vocab"]) == (r["cut"], r["type"], "llama", "all")
        )
        lines.append(
            f"| {r['cut']} | {r['type']} | {r['arch']} | {r['vocab']} | {r['bytes_read'] / 1e6:.1f} | "
            f"{r['prefill_tok_s']:.0f} | {r['decode_tok_s']:.1f} | "
            f"{r['decode_tok_s'] / base['decode_tok_s']:.2f}x |"
        )
    return "\n".join(lines)


def head_share(rows: list[dict]) -> list[str]:
    """Per type: the share of a decode step's time the full output head costs, from the step time
    with every row against the step time with --vocab rows, next to its share of bytes read."""
    lines = []
    for full in (r for r in rows if r["cut"] == "unpruned" and r["arch"] == "llama" and r["vocab"] == "all"):
        small = next(r for r in rows if r["type"] == full["type"] and r["vocab"] != "all")
        t_full, t_small = 1 / full["decode_tok_s"], 1 / small["decode_tok_s"]
        time_share = (t_full - t_small) / t_full
        byte_share = (full["bytes_read"] - small["bytes_read"]) / full["bytes_read"]
        lines.append(f"{full['type']}: the output head beyond {small['vocab']} rows is {time_share:.0%} of decode time "
                     f"and {byte_share:.0%} of the bytes read")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--scores", type=Path, required=True, help="a `score --ffn` artifact of --model")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--types", default="f16,q8_0")
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--engine",
        default=os.path.join(os.environ.get("HEADPRUNE_LLAMA_CPP_ENV", ".engines/llama-cpp"), "bin", "python"),
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.types = args.types.split(",")
    rows = make_files(args)
    measure(args, rows)
    print(markdown(rows))
    print("\n".join(head_share(rows)))
    if args.json:
        table = [{k: str(v) if isinstance(v, Path) else v for k, v in r.items()} for r in rows]
        args.json.write_text(json.dumps({"rows": table, "args": {k: str(v) for k, v in vars(args).items()}}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
