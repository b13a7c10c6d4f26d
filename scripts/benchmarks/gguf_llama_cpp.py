"""The trained LM of BENCHMARKS.md ("Which method") served by llama.cpp: perplexity and speed of GGUF exports.

Three models: the unpruned trained LM, a uniform cut and a non-uniform cut at the same parameter
budget (`--target-params`, default 0.50: KV groups and FFN neurons by fisher scores, lstsq
compensation, as the trained LM's `both` rows in BENCHMARKS.md "Which method"). Each is
exported with `export --gguf` in every type asked for, and in llama.cpp (llama-cpp-python in
its own environment, scripts/engines/llama_cpp.sh):
- perplexity on the first --eval-docs held-out documents (128 tokens each, the token ids
  headprune's own reader makes, so both sides score the same tokens; the KV cache in f32), beside
  headprune's own perplexity of the checkpoint; and how many documents llama.cpp's own tokenizer
  splits differently;
- prefill (a --prompt-tokens prompt in one batch) and decode (the --decode-tokens tokens that follow
  it, one at a time) tokens/s with --threads threads, median of --repeats, llama.cpp's default f16 KV cache.

Usage (the trained LM from `python -m scripts.tools.make_trained_lm --recipe full ... > summary.json`):
    python -m scripts.benchmarks.gguf_llama_cpp --summary summary.json --work /tmp/gguf-bench/work \
        --json /tmp/gguf-bench/result.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ENGINE = ROOT / ".engines" / "llama-cpp" / "bin" / "python"

ENGINE = r"""
import json, math, sys, time
import numpy as np
from llama_cpp import Llama

path, rows_file, threads, prompt_len, decode_n, repeats = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
data = json.load(open(rows_file))
rows, texts = data["rows"], data["texts"]
out = {}
# One thread for perplexity: on a shared machine, threads that wait for each other at every
# step cost more than they give on a model this small; speed below uses --threads.
llm = Llama(model_path=path, n_ctx=256, n_batch=256, n_threads=1, logits_all=True, type_k=0, type_v=0, verbose=False)
total = count = 0.0
for ids in rows:
    llm.reset()
    llm.eval(ids)
    logits = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    top = logits.max(axis=1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
    total -= logp[np.arange(len(ids) - 1), ids[1:]].sum()
    count += len(ids) - 1
out["perplexity"] = math.exp(total / count)
out["tokenizer_mismatches"] = sum(
    llm.tokenize(t.encode("utf-8"), add_bos=True, special=False)[: len(ids)] != ids for t, ids in zip(texts, rows)
)
del llm
llm = Llama(model_path=path, n_ctx=prompt_len + decode_n + 8, n_batch=prompt_len, n_threads=threads, verbose=False)
stream = [t for ids in rows for t in ids]
prompt, follow = stream[:prompt_len], stream[prompt_len : prompt_len + decode_n]
prefill, decode = [], []
for _ in range(repeats):
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    mid = time.perf_counter()
    for token in follow:  # the held-out text's next tokens: a decode step costs the same whatever the token
        llm.eval([token])
    end = time.perf_counter()
    prefill.append(prompt_len / (mid - start))
    decode.append(decode_n / (end - mid))
out["prefill_tok_s"], out["decode_tok_s"] = prefill, decode
print(json.dumps(out))
"""


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def headprune(*args: str, threads: int) -> None:
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "headprune_cli", *args], check=False, capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        raise SystemExit(f"headprune {' '.join(args)} failed: {done.stderr.strip()[-800:]}")
    log(f"  {time.perf_counter() - start:6.1f}s headprune {' '.join(args)}")


def cuts(summary: dict, work: Path, keep: str, threads: int) -> dict[str, Path]:
    """The unpruned model and the uniform / non-uniform cuts at `keep` of the parameters."""
    model, calib = summary["checkpoint"], summary["calib"]
    scores = work / "ffn-fisher.json"
    if not scores.is_file():
        headprune(
            "score",
            model,
            "--data",
            calib,
            "--samples",
            "256",
            "--method",
            "fisher",
            "--ffn",
            "-o",
            str(scores),
            threads=threads,
        )
    found = {"unpruned": Path(model)}
    for name, extra in (("non-uniform", []), ("uniform", ["--uniform"])):
        out = work / f"both-keep_{keep}-{name}-lstsq.safetensors"
        if not out.is_file():
            headprune(
                "prune", "--scores", str(scores), "--target-params", keep, *extra, "-o", str(out),
                "--compensate", "lstsq", "--data", calib, "--samples", "256", threads=threads,
            )  # fmt: skip
        found[name] = out
    return found


def eval_rows(summary: dict, work: Path, docs: int) -> tuple[Path, object]:
    """The held-out token rows headprune's reader makes (128 tokens each), written for the engine."""
    import headprune_cli
    from headprune_cli import read_data

    valid = work / "valid-eval.txt"
    texts = Path(summary["valid"]).read_text(encoding="utf-8").splitlines()[:docs]
    valid.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    dataset = read_data(valid, headprune_cli.load(summary["checkpoint"]), max_length=128)
    rows = [ids[mask.bool()].tolist() for ids, mask in zip(dataset.input_ids, dataset.attention_mask)]
    path = work / "eval-rows.json"
    path.write_text(json.dumps({"rows": rows, "texts": texts}), encoding="utf-8")
    return path, dataset


def own_perplexity(path: Path, dataset) -> tuple[float, int]:
    import headprune_cli
    from headprune_cli import evaluate

    model = headprune_cli.load(path)
    ppl = next(m.value for m in evaluate(model, dataset, "causal-lm") if m.name == "perplexity")
    return ppl, sum(p.numel() for p in model.parameters())


def engine_run(engine: str, gguf: Path, rows: Path, args) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    command = [engine, "-I", "-c", ENGINE, str(gguf), str(rows), str(args.threads), str(args.prompt_tokens)]
    command += [str(args.decode_tokens), str(args.repeats)]
    done = subprocess.run(command, check=False, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"llama.cpp failed on {gguf}: {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", type=Path, required=True, help="make_trained_lm's JSON summary")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--keep", default="0.50")
    parser.add_argument("--types", default="f32,f16,q8_0,q4_0")
    parser.add_argument("--eval-docs", type=int, default=500)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engine-python", default=str(DEFAULT_ENGINE))
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="NAME=CHECKPOINT",
        help="another checkpoint to serve beside the three (e.g. a cut after `finetune`); repeatable",
    )
    parser.add_argument("--only", help="comma-separated model names to run (default: all)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    summary = json.loads(args.summary.read_text())
    args.work.mkdir(parents=True, exist_ok=True)
    models = cuts(summary, args.work, args.keep, args.threads)
    models |= {name: Path(path) for name, path in (item.split("=", 1) for item in args.also)}
    if args.only:
        models = {name: models[name] for name in args.only.split(",")}
    rows, dataset = eval_rows(summary, args.work, args.eval_docs)
    results = []
    for name, path in models.items():
        ppl, params = own_perplexity(path, dataset)
        log(f"{name}: {params} params, headprune perplexity {ppl:.2f}")
        for kind in args.types.split(","):
            gguf = args.work / f"{name}-{kind}.gguf"
            headprune("export", str(path), "--gguf", str(gguf), "--gguf-type", kind, "--force", threads=args.threads)
            got = engine_run(args.engine_python, gguf, rows, args)
            row = {
                "model": name,
                "params": params,
                "headprune_perplexity": ppl,
                "type": kind,
                "bytes": gguf.stat().st_size,
            }
            row |= got | {"prefill_median": statistics.median(got["prefill_tok_s"])}
            row["decode_median"] = statistics.median(got["decode_tok_s"])
            results.append(row)
            log(
                f"  {kind:5s} {row['bytes'] / 1e6:6.1f} MB  llama.cpp ppl {got['perplexity']:8.2f} "
                f"(headprune {ppl:8.2f}, {got['perplexity'] / ppl - 1:+.3%})  tokenizer mismatches "
                f"{got['tokenizer_mismatches']}  prefill {row['prefill_median']:8.0f} tok/s  "
                f"decode {row['decode_median']:6.0f} tok/s"
            )
    if args.json:
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": results}, indent=1)
        )


if __name__ == "__main__":
    main()
