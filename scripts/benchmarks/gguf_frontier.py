"""Pruning that pays in llama.cpp: cuts at several FLOPs targets, each GGUF type, against
quantizing alone (BENCHMARKS.md, "Which engine").

    python -m scripts.benchmarks.gguf_frontier --model M.safetensors --calib calib.txt --heldout heldout.txt \\
        --work DIR [--targets 0.9,0.8,0.7,0.5] [--types f16,q8_0,q4_K_M,q4_0] [--score-rows 64] [--refit-rows 256] \\
        [--eval-rows 32] [--threads 2] [--repeats 3] --json out.json [--plot frontier.png]
    # each cut also after N steps of LoRA + KD on --train (rows labelled T+loraN; 0: the cut as it is)
    ... --recover-steps 0,40 --train train.txt
    # the 1.1 B shape (random weights, no tokenizer): speed and size only, a cut's files at a time
    ... --method random --no-compensation --no-perplexity --tokenizer-text train.txt --per-target

Every cut runs through the CLI: `score --ffn --method M --objective causal-lm` on --calib
(once), then per target and grid `select --target-flops T --runtime llama.cpp --gguf-type G` (G
the type's quantization grid: q8_0 and q4_0 share the 32-grid cut, which f16 reuses; the
k-quants share the 256-grid one) -> `prune --data CALIB --samples SCORE_ROWS` (lstsq; none with
--no-compensation) -> `export --gguf --gguf-type TYPE`; the unpruned model is exported in every
type too. A checkpoint without a tokenizer (llama.cpp needs one in the file) first gets a
byte-level BPE trained on --tokenizer-text (vocabulary: the model's), saved beside the cuts.

llama.cpp (llama-cpp-python in its engine environment, where headprune is not importable) then
measures every file: perplexity on the first --eval-rows held-out lines (128 tokens each,
llama.cpp's own tokenizer, the same tokens for every file; none with --no-perplexity), prefill
tokens/s (a --prompt-token prompt in one batch, default 128) and decode tokens/s (--decode tokens, one at a time),
the best of --repeats rounds with the files interleaved within each round, so load on the machine
hits them alike. With --per-target the unpruned files are measured again with each target's cut
files (which are then deleted), and each cut is compared with the unpruned of its own run.

Two predictions of decode per row: FLOP-predicted speedup (the plan's FLOPs per token, before
over after) against the unpruned file of the same type; and bytes-predicted tokens/s: decode is
bytes read (gguf_decode_bytes: the file's weights at its type's bits per weight + the KV cache
at the mean context), so a bandwidth calibrated on the unpruned f16 file (its tokens/s x its
bytes) over a file's bytes predicts its tokens/s; measured / predicted says how much of it
llama.cpp delivers for each type.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import headprune_cli

# The grid each type's cut is chosen on: f16 has none of its own and reuses q8_0's 32-grid cut (a
# width on the 32-grid costs f16 nothing, and one cut fewer is made); the k-quants share 256's.
GRIDS = {
    "f16": "q8_0",
    "f32": "q8_0",
    "q8_0": "q8_0",
    "q4_0": "q8_0",
    "q4_1": "q8_0",
    "q5_0": "q8_0",
    "q5_1": "q8_0",
    "q4_K_M": "q4_K_M",
    "q5_K_M": "q4_K_M",
    "q6_K": "q4_K_M",
}


# A type spec's @suffix -> the export options it adds to --calib-data.
WEIGHINGS = {"imatrix": [], "gptq": ["--gguf-rounding", "gptq"]}


def export_args(kind: str, args: argparse.Namespace) -> list[str]:
    """`--gguf-type` (and `--gguf-embedding-type`, `--calib-data`) of a type spec: TYPE, or
    TYPE+EMBEDDING for the token embedding / output head in its own type (e.g. q4_0+q8_0, as
    llama-quantize's --token-embedding-type), and @imatrix for blocks weighed by the importance
    of their columns on the first --refit-rows rows of --calib (e.g. q4_0@imatrix), @gptq for
    blocks GPTQ rounds on those rows."""
    spec, _, weighed = kind.partition("@")
    base, _, embedding = spec.partition("+")
    argv = ["--gguf-type", base, *(["--gguf-embedding-type", embedding] if embedding else [])]
    if not weighed:
        return argv
    return argv + ["--calib-data", str(args.calib), "--calib-samples", str(args.refit_rows), *WEIGHINGS[weighed]]


def grid_of(kind: str) -> str:
    return GRIDS[kind.partition("@")[0].partition("+")[0]]


ENGINE = r"""
import json, sys, time
import numpy as np
from llama_cpp import Llama

request = json.loads(sys.argv[1])
files, rows, threads = request["files"], request["rows"], request["threads"]
tokenizer = Llama(model_path=files[0], n_ctx=256, vocab_only=True, verbose=False)
ids = [tokenizer.tokenize(text.encode("utf-8"), add_bos=True, special=False)[:128] for text in rows]
ids = [row for row in ids if len(row) >= 16]
prompt = max(ids, key=len)[: request["prompt"]]

def load(path, logits_all=False):
    return Llama(model_path=path, n_ctx=256, n_batch=256, n_threads=threads, n_threads_batch=threads,
                 logits_all=logits_all, verbose=False)

out = {}
for path in files:
    out[path] = {"perplexity": None, "tokens": 0, "prefill": [], "decode": []}
    if not request["perplexity"]:
        continue
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
    out[path].update(perplexity=float(np.exp(nll / count)), tokens=count)
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


def with_tokenizer(args: argparse.Namespace) -> Path:
    """--model, or a copy carrying a byte-level BPE trained on --tokenizer-text when it has none."""
    if "headprune.tokenizer" in safetensors_metadata(args.model):
        return args.model
    out = args.work / "model-with-tokenizer.safetensors"
    if out.exists():
        return out
    if args.tokenizer_text is None:
        raise SystemExit(f"{args.model} carries no tokenizer: pass --tokenizer-text FILE to train one")
    model = headprune_cli.load(args.model)
    info = headprune_cli.info_of(model)
    info.tokenizer = bpe(args.tokenizer_text, info.config["vocab_size"]).to_str()
    info.tokenizer_config = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    headprune_cli.save(model, out)
    return out


def safetensors_metadata(path: Path) -> dict:
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(size)).get("__metadata__", {})


def bpe(text: Path, size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<s>", "</s>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=specials, initial_alphabet=alphabet)
    tok.train_from_iterator(text.read_text(encoding="utf-8").splitlines(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


def flops_kept(plan: Path | None) -> float:
    if plan is None:
        return 1.0
    predicted = json.loads(plan.read_text())["predicted"]
    return predicted["after"]["flops_per_token"] / predicted["before"]["flops_per_token"]


def unpruned_files(args: argparse.Namespace, model: Path) -> dict[tuple[str, str], tuple[Path, Path | None]]:
    """(cut, type) -> (GGUF file, its plan); cut 'unpruned' or the FLOPs target."""
    scores = args.work / "scores.json"
    if not scores.exists():
        scoring = ["--objective", "causal-lm", "--method", args.method, "--ffn", "--samples", args.score_rows]
        headprune("score", model, "--data", args.calib, *scoring, "--max-length", 128, "--batch-size", 4, "-o", scores)
    files = {}
    for steps in args.recover_steps:  # quantize alone, after the same training as the cuts when they train
        label = trained("unpruned", steps)
        for kind in args.types:
            out = args.work / f"{label}-{kind}.gguf"
            if not out.exists():
                headprune("export", recovered(args, model, steps), "--gguf", out, *export_args(kind, args))
            files[(label, kind)] = (out, None)
    return files


def cut_files(args: argparse.Namespace, target: float) -> dict[tuple[str, str], tuple[Path, Path | None]]:
    files = {}
    for steps in args.recover_steps:
        label = trained(str(target), steps)
        for kind in args.types:
            grid = grid_of(kind)
            cut = args.work / f"cut-{target}-{grid}.safetensors"
            plan = cut.with_suffix(".json")
            out = args.work / f"cut-{label}-{kind}.gguf"
            if not cut.exists() and not out.exists():
                # --force: an interrupted run's plan (its cut was never written) is redone
                headprune("select", args.work / "scores.json", "--target-flops", target, "--runtime", "llama.cpp",
                          "--gguf-type", grid, "-o", plan, "--force")  # fmt: skip
                data = [] if args.no_compensation else ["--data", args.calib, "--samples", args.refit_rows]
                headprune("prune", "--plan", plan, *data, "--max-length", 128, "-o", cut)
            if not out.exists():
                headprune("export", recovered(args, cut, steps), "--gguf", out, *export_args(kind, args))
            files[(label, kind)] = (out, plan)
    return files


def trained(cut: str, steps: int) -> str:
    """A row's cut label: 'unpruned' or the FLOPs target, +loraN after N recovery steps."""
    return f"{cut}+lora{steps}" if steps else cut


def recovered(args: argparse.Namespace, model: Path, steps: int) -> Path:
    """The model itself (steps 0), or after `steps` steps of LoRA + distillation from the unpruned
    model (`finetune --lora --teacher MODEL`: half cross-entropy on --train, half KD; 8 rows x 128
    tokens a step). The unpruned model trains too (its teacher is itself), so that training on
    --train's domain is not credited to pruning."""
    if not steps:
        return model
    out = args.work / f"{model.stem}-lora{steps}.safetensors"
    if not out.exists():
        # --teacher: the unpruned model for both (what `auto` finds for a cut; the unpruned has no parent)
        headprune("finetune", model, "--data", args.train, "--teacher", args.model, "--lora", "--steps", steps,
                  "--batch-size", 8, "--max-length", 128, "--seed", 0, "-o", out)  # fmt: skip
    return out


def measure(args: argparse.Namespace, files: dict) -> list[dict]:
    """One interleaved run of llama.cpp over `files` (which include the unpruned of every type)."""
    rows = [line for line in args.heldout.read_text(encoding="utf-8").splitlines() if line.strip()][: args.eval_rows]
    paths = [path for path, _ in files.values()]
    request = {"files": [str(p) for p in paths], "rows": rows, "threads": args.threads, "repeats": args.repeats,
               "decode": args.decode, "prompt": args.prompt, "perplexity": not args.no_perplexity}  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([args.engine, "-c", ENGINE, json.dumps(request)], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"llama.cpp run failed:\n{done.stderr[-2000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    context = args.prompt + args.decode / 2  # the prompt is at most --prompt tokens
    table = []
    for (cut, kind), (path, plan) in files.items():
        m = found[str(path)]
        table.append({"cut": cut, "type": kind, "file_mb": path.stat().st_size / 1e6,
                      "bytes_read": headprune_cli.gguf_decode_bytes(path, context)["total"],
                      "flops_kept": flops_kept(plan), "perplexity": m["perplexity"], "tokens": m["tokens"],
                      "prefill_tok_s": max(m["prefill"]), "decode_tok_s": max(m["decode"])})  # fmt: skip
    return predict(table)


def predict(table: list[dict]) -> list[dict]:
    """Each row against the unpruned row of its type (FLOPs) and of f16 (the bytes model's calibration)."""
    calibration = next((r for r in table if r["cut"] == "unpruned" and r["type"] == "f16"), None)
    bandwidth = calibration["decode_tok_s"] * calibration["bytes_read"] if calibration else None
    for row in table:
        base = next(r for r in table if r["cut"] == "unpruned" and r["type"] == row["type"])
        row["decode_speedup"] = row["decode_tok_s"] / base["decode_tok_s"]
        row["prefill_speedup"] = row["prefill_tok_s"] / base["prefill_tok_s"]
        row["flop_predicted"] = base["flops_kept"] / row["flops_kept"]
        row["bytes_predicted_tok_s"] = bandwidth / row["bytes_read"] if bandwidth else None
        if calibration:
            row["vs_f16"] = row["decode_tok_s"] / calibration["decode_tok_s"]
    return table


def remeasured(args: argparse.Namespace) -> list[dict]:
    """An earlier run's measurements (--measured JSON) of the files still in --work, with today's
    predictions: the bytes and FLOPs come from the files and plans, the tokens/s from the JSON."""
    table = []
    for old in json.loads(args.measured.read_text())["rows"]:
        cut, kind = old["cut"], old["type"]
        alone = cut.startswith("unpruned")
        path = args.work / f"{cut}-{kind}.gguf" if alone else args.work / f"cut-{cut}-{kind}.gguf"
        plan = None if alone else args.work / f"cut-{cut.partition('+')[0]}-{grid_of(kind)}.json"
        keep = ("cut", "type", "file_mb", "perplexity", "tokens", "prefill_tok_s", "decode_tok_s")
        row = {k: old[k] for k in keep}
        row.update(bytes_read=headprune_cli.gguf_decode_bytes(path, args.prompt + args.decode / 2)["total"])
        row.update(flops_kept=flops_kept(plan))
        table.append(row)
    return predict(table)


def run(args: argparse.Namespace) -> list[dict]:
    """Every file measured: in one run, or (--per-target) one run per target with the unpruned again."""
    args.work.mkdir(parents=True, exist_ok=True)
    model = with_tokenizer(args)
    unpruned = unpruned_files(args, model)
    if not args.per_target:
        files = dict(unpruned)
        for target in args.targets:
            files.update(cut_files(args, target))
        return [] if args.files_only else measure(args, files)
    table: list[dict] = []
    for target in args.targets:
        cuts = cut_files(args, target)
        for grid in {grid_of(kind) for kind in args.types}:  # the cut checkpoints are no longer needed
            args.work.joinpath(f"cut-{target}-{grid}.safetensors").unlink(missing_ok=True)
        found = measure(args, {**unpruned, **cuts})
        table += [r for r in found if not r["cut"].startswith("unpruned") or not table]
        for path, _ in cuts.values():
            path.unlink()
        print(markdown(table), file=sys.stderr, flush=True)  # each target's rows as soon as they are measured
    return table


def markdown(table: list[dict]) -> str:
    lines = [
        "| cut (FLOPs kept) | type | file MB | perplexity | prefill tok/s | decode tok/s | decode vs unpruned, same "
        "type (FLOP-predicted, measured/predicted) | bytes-predicted decode tok/s (measured/predicted) "
        "| decode vs unpruned f16 |",
        "|---|---|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in table:
        ppl = "-" if r["perplexity"] is None else f"{r['perplexity']:.2f}"
        speed = (
            f"{r['decode_speedup']:.2f}x ({r['flop_predicted']:.2f}x, {r['decode_speedup'] / r['flop_predicted']:.2f})"
        )
        by_bytes = r["bytes_predicted_tok_s"]
        by_bytes = f"{by_bytes:.1f} ({r['decode_tok_s'] / by_bytes:.2f})" if by_bytes else "-"
        against = f"{r['vs_f16']:.2f}x" if "vs_f16" in r else "-"
        lines.append(
            f"| {r['cut']} | {r['type']} | {r['file_mb']:.1f} | {ppl} | {r['prefill_tok_s']:.0f} | "
            f"{r['decode_tok_s']:.1f} | {speed} | {by_bytes} | {against} |"
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
    trained = [r for r in table if r["cut"].startswith("unpruned+")]
    if trained:
        xs, ys = [r["decode_tok_s"] for r in trained], [r["perplexity"] for r in trained]
        ax.plot(xs, ys, "^", color="gray", label="quantize alone, trained as the cuts")
    for kind in sorted({r["type"] for r in table}):
        cuts = [r for r in table if r["type"] == kind and not r["cut"].startswith("unpruned")]
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
    parser.add_argument("--types", default="f16,q8_0,q4_K_M,q4_0", help="TYPE or TYPE+EMBEDDING_TYPE (q4_0+q8_0)")
    parser.add_argument("--score-rows", type=int, default=64)
    parser.add_argument("--method", default="fisher", help="score --method (random for random weights)")
    parser.add_argument("--refit-rows", type=int, help="calibration rows of the lstsq refit (default: --score-rows)")
    parser.add_argument("--no-compensation", action="store_true", help="prune without --data (no lstsq)")
    parser.add_argument("--recover-steps", default="0", help="LoRA + KD steps before export: 0 (none) or a list, 0,40")
    parser.add_argument("--train", type=Path, help="--recover-steps' training text (never --heldout)")
    parser.add_argument("--no-perplexity", action="store_true", help="speed and size only (random weights)")
    parser.add_argument("--tokenizer-text", type=Path, help="train a BPE on it for a model without a tokenizer")
    parser.add_argument("--per-target", action="store_true", help="one target's files on disk at a time")
    parser.add_argument("--measured", type=Path, help="an earlier run's --json: its speeds, today's predictions")
    parser.add_argument("--eval-rows", type=int, default=32)
    parser.add_argument("--decode", type=int, default=48)
    parser.add_argument("--prompt", type=int, default=128, help="prefill tokens (the longest held-out row, cut)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--engine",
        default=os.path.join(os.environ.get("HEADPRUNE_LLAMA_CPP_ENV", ".engines/llama-cpp"), "bin", "python"),
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--files-only", action="store_true", help="make the cuts and GGUF files, measure nothing")
    args = parser.parse_args(argv)
    args.targets = [float(t) for t in args.targets.split(",")]
    args.types = args.types.split(",")
    unknown = [
        t
        for t in args.types
        if t.partition("@")[0].partition("+")[0] not in GRIDS or t.partition("@")[2] not in ("", *WEIGHINGS)
    ]
    if unknown:
        known = f"{', '.join(GRIDS)}, each optionally +EMBEDDING_TYPE and @{' or @'.join(WEIGHINGS)}"
        parser.error(f"unknown types {unknown}; known: {known}")
    args.recover_steps = [int(n) for n in args.recover_steps.split(",")]
    args.refit_rows = args.refit_rows or args.score_rows
    if any(args.recover_steps) and args.train is None:
        parser.error("--recover-steps needs --train")
    table = remeasured(args) if args.measured else run(args)
    if args.files_only:
        return 0
    print(markdown(table))
    if args.json:
        args.json.write_text(json.dumps({"rows": table, "args": {k: str(v) for k, v in vars(args).items()}}, indent=2))
    if args.plot and not args.no_perplexity:
        plot(table, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
