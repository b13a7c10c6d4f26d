"""Pruning a causal LM that has learned something: perplexity, recovery and decode speed.

The model is scripts/tools/make_trained_lm.py's `small` recipe (or --recipe) (LLaMA-shaped, 8 layers,
8 query / 4 KV heads, trained on Debian package descriptions). Every headprune row is
made by the CLI itself (`python -m headprune_cli ...`, the command kept with the row),
then scored in-process by headprune's own causal-LM perplexity on the first
--eval-docs documents of the held-out split (split by a hash of the source package;
each document truncated to 128 tokens). Scores and compensation use the calibration
split, which training never saw either.

Usage (from the repo root, after make_trained_lm has built the model; the peer is
optional and lives in its own venv, see trained_lm_peer.py):
  nice -n 10 python -m scripts.benchmarks.trained_lm --apt-lists DIR [--peer-python /tmp/venv-tp/bin/python]
      [--work /tmp/trained-lm-bench] [--json out.json] [--sections kv,layers,joint,peer,finetune,decode]
      [--finetune-routes full,lora-x1,lora,lora-x30,fsdp]   (the recovery routes of BENCHMARKS.md, "Which recovery")
Prints the markdown for BENCHMARKS.md on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from scripts.tools.lm_corpus import debian_documents
from scripts.tools.make_trained_lm import RECIPES, build, default_cache, with_paths

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("kv", "ffn", "both", "layers", "joint", "peer", "finetune", "decode")
COMPENSATIONS = ("none", "bias", "lstsq")


@dataclass
class Row:
    section: str
    label: str
    commands: list[str]
    parameters: int
    perplexity: float
    extra: dict = field(default_factory=dict)


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Bench:
    """Runs headprune commands into a work folder and measures what they write."""

    def __init__(self, summary: dict, work: Path, eval_docs: int, threads: int):
        import torch

        import headprune_cli
        from headprune_cli import read_data

        self.summary, self.work, self.threads = summary, work, threads
        self.model_path, self.calib = Path(summary["checkpoint"]), Path(summary["calib"])
        work.mkdir(parents=True, exist_ok=True)
        self.valid = work / "valid-eval.txt"
        lines = Path(summary["valid"]).read_text(encoding="utf-8").splitlines()[:eval_docs]
        self.valid.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        torch.set_num_threads(threads)
        self.base = headprune_cli.load(self.model_path)
        self.dataset = read_data(self.valid, self.base, max_length=128)
        self.base_params = self.count(self.base)
        self._ppl: dict[str, float] = {}
        self.rows: list[Row] = []
        self.failures: list[str] = []

    @staticmethod
    def count(model) -> int:
        return sum(p.numel() for p in model.parameters())

    def shown(self, args: list[str]) -> str:
        """The command as a reader types it: $M is the model, $CALIB the calibration text, $W the work folder."""
        text = shlex.join(["headprune", *args])
        return text.replace(str(self.model_path), "$M").replace(str(self.calib), "$CALIB").replace(str(self.work), "$W")

    def headprune(self, *args: str, launcher: list[str] | None = None) -> int:
        """Run one CLI command (outputs replaced with --force where it takes one), by default as
        `python -m headprune_cli`; its peak resident memory in bytes (for a launcher such as
        torchrun: the largest of its processes, as wait4 reports it)."""
        command = [*(launcher or [sys.executable, "-m", "headprune_cli"]), *args]
        env = os.environ | {"OMP_NUM_THREADS": str(self.threads), "PYTHONPATH": str(ROOT)}
        start = time.perf_counter()
        with tempfile.TemporaryFile(mode="w+") as errors:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors, env=env, cwd=ROOT)
            _, status, usage = os.wait4(process.pid, 0)  # reaped here, so that its rusage is ours to read
            process.returncode = os.waitstatus_to_exitcode(status)
            if process.returncode != 0:
                errors.seek(0)
                raise RuntimeError(f"{self.shown(list(args))} failed: {errors.read().strip()[-800:]}")
        log(f"  {time.perf_counter() - start:5.1f}s {self.shown(list(args))}")
        return usage.ru_maxrss * 1024  # Linux reports kilobytes

    def perplexity(self, path: Path) -> tuple[float, int]:
        import headprune_cli
        from headprune_cli import evaluate

        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        model = headprune_cli.load(path)
        if sha not in self._ppl:  # identical files (e.g. bias on a bias-free LLaMA) are scored once
            self._ppl[sha] = next(m.value for m in evaluate(model, self.dataset, "causal-lm") if m.name == "perplexity")
        return self._ppl[sha], self.count(model)

    def scores(self, name: str, *options: str) -> tuple[Path, str]:
        out = self.work / f"{name}.json"
        args = ["score", str(self.model_path), "--data", str(self.calib), "--samples", "256", *options, "-o", str(out)]
        if not out.is_file():
            self.headprune(*args)
        return out, self.shown(args)

    def prune(self, section: str, label: str, scores: tuple[Path, str], *select: str, compensate: str = "none") -> Row:
        out = self.work / f"{section}-{label.replace(' ', '_').replace('/', '-')}.safetensors"
        args = ["prune", "--scores", str(scores[0]), *select, "-o", str(out), "--force"]
        if compensate != "none":
            args += ["--compensate", compensate, "--data", str(self.calib), "--samples", "256"]
        self.headprune(*args)
        ppl, params = self.perplexity(out)
        row = Row(section, label, [scores[1], self.shown(args)], params, ppl, {"checkpoint": str(out)})
        self.rows.append(row)
        log(f"{section:7s} {label:40s} removed {self.removed(params):6.1%}  ppl {ppl:9.2f}")
        return row

    def try_prune(self, *args, **kwargs) -> Row | None:
        """A cut the CLI refuses (a budget out of reach) is reported, not fatal."""
        try:
            return self.prune(*args, **kwargs)
        except RuntimeError as exc:
            log(f"refused: {exc}")
            self.failures.append(str(exc))
            return None

    def removed(self, params: int) -> float:
        return 1 - params / self.base_params


def variants(keeps, with_bias):
    """(keep, uniform, compensation): none and lstsq everywhere; bias once, since a LLaMA
    output projection has no bias and `--compensate bias` skips it (the file is unchanged)."""
    for keep in keeps:
        for uniform in (False, True):
            for comp in ("none", "lstsq") + (("bias",) if with_bias and not uniform and keep == keeps[0] else ()):
                yield keep, uniform, comp


def prune_variants(bench: Bench, section: str, prefix: str, scores, keeps, with_bias: bool) -> None:
    for keep, uniform, comp in variants(keeps, with_bias):
        label = f"{prefix}keep {keep} {'uniform' if uniform else 'per-layer'} {comp}"
        bench.try_prune(
            section, label, scores, "--target-params", keep, *(["--uniform"] if uniform else []), compensate=comp
        )


def kv_rows(bench: Bench, keeps=("0.95", "0.90")) -> None:
    heads = bench.scores("heads-taylor", "--method", "taylor")
    prune_variants(bench, "kv", "", heads, keeps, with_bias=True)


def ffn_rows(bench: Bench, keeps=("0.80", "0.50")) -> None:
    """FFN neurons only: every head kept (`--min-heads` = the heads per layer)."""
    scores = bench.scores("ffn-fisher", "--method", "fisher", "--ffn")
    all_heads = str(bench.base.config.num_attention_heads)
    for keep, uniform, comp in variants(keeps, with_bias=True):
        label = f"keep {keep} {'uniform' if uniform else 'per-layer'} {comp}"
        bench.try_prune(
            "ffn",
            label,
            scores,
            "--target-params",
            keep,
            "--min-heads",
            all_heads,
            *(["--uniform"] if uniform else []),
            compensate=comp,
        )


def both_rows(bench: Bench, keeps=("0.80", "0.50")) -> None:
    """KV groups and FFN neurons under one parameter budget (fisher scores both)."""
    prune_variants(bench, "both", "", bench.scores("ffn-fisher", "--method", "fisher", "--ffn"), keeps, with_bias=False)


def layer_scores(bench: Bench, method: str):
    return bench.scores(f"layers-{method}", "--method", "taylor", "--layers", "--layer-method", method)


def layer_rows(bench: Bench, drops=("2", "3")) -> None:
    for method in ("cosine", "loo", "refit"):
        for drop in drops + (str(int(drops[-1]) + 1),) * (method == "refit"):
            bench.try_prune(
                "layers", f"{method} drop {drop}", layer_scores(bench, method), "--ratio", "0", "--drop-layers", drop
            )


def joint_rows(bench: Bench, keeps=("0.80", "0.50")) -> None:
    prune_variants(bench, "joint", "refit ", layer_scores(bench, "refit"), keeps, with_bias=True)
    for keep in keeps:
        bench.try_prune("joint", f"loo keep {keep} per-layer none", layer_scores(bench, "loo"), "--target-params", keep)


def peer_rows(bench: Bench, python: str, keeps=("0.80", "0.50")) -> None:
    from transformers import AutoModelForCausalLM

    from headprune_cli import evaluate

    script = ROOT / "scripts" / "benchmarks" / "trained_lm_peer.py"
    for keep in keeps:
        out = bench.work / f"peer-keep{keep}"
        command = [python, str(script), bench.summary["hf_folder"], "--keep", keep, "-o", str(out)]
        start = time.perf_counter()
        done = subprocess.run(
            command, capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": str(bench.threads)}
        )
        if done.returncode != 0:
            raise RuntimeError(f"peer failed: {done.stderr.strip()[-1500:]}")
        info = json.loads(done.stdout)
        model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
        ppl = next(m.value for m in evaluate(model, bench.dataset, "causal-lm") if m.name == "perplexity")
        shown = shlex.join(
            ["python", "scripts/benchmarks/trained_lm_peer.py", "$M_HF", "--keep", keep, "-o", f"$W/peer-keep{keep}"]
        )
        bench.rows.append(
            Row(
                "peer",
                f"Torch-Pruning keep {keep}",
                [shown],
                info["parameters"],
                ppl,
                {"ratio": info["ratio"], "config": info["config"], "seconds": round(time.perf_counter() - start, 1)},
            )
        )
        log(f"peer    keep {keep}: removed {bench.removed(info['parameters']):.1%} ppl {ppl:.2f} ({info['config']})")


def finetune_rows(bench: Bench, docs: int, keep: str = "0.50", routes: tuple[str, ...] = ("full",)) -> None:
    """One epoch of distillation from the unpruned model after the best retraining-free cut at
    `keep`, each route on the same documents: full (every weight, AdamW), lora (the default
    rate), lora-xN (N x full training's default rate), fsdp (torchrun, 2 processes, gloo)."""
    train = bench.work / "finetune-train.txt"
    lines = Path(bench.summary["train"]).read_text(encoding="utf-8").splitlines()[:docs]
    train.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    cuts = [r for r in bench.rows if r.section in ("ffn", "both", "joint") and f"keep {keep} per-layer" in r.label]
    for row in sorted(cuts, key=lambda r: r.perplexity)[:1]:  # the best retraining-free cut at `keep`
        source = Path(row.extra["checkpoint"])
        for route in routes:
            out = source.with_name(source.stem + ("-ft" if route == "full" else f"-ft-{route}") + ".safetensors")
            args = ["finetune", str(source), "--data", str(train), "--teacher", "auto", "--epochs", "1"]
            args += [*_route_options(route, source), "-o", str(out), "--force"]
            torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "headprune_cli"]
            launcher = torchrun if route == "fsdp" else None
            started = time.perf_counter()
            peak = bench.headprune(*args, launcher=launcher)
            seconds = round(time.perf_counter() - started, 1)
            ppl, params = bench.perplexity(out)
            extra = {"before": row.perplexity, "route": route, "peak_rss_bytes": peak, "seconds": seconds}
            label = row.label if route == "full" else f"{row.label}, {route}"
            shown = bench.shown(args).replace("headprune ", "torchrun --nproc-per-node 2 -m headprune_cli ", 1)
            command = shown if route == "fsdp" else bench.shown(args)
            bench.rows.append(Row("finetune", label, row.commands + [command], params, ppl, extra))
            log(f"finetune {label}: {row.perplexity:.2f} -> {ppl:.2f} ({seconds} s, peak {peak / 2**30:.2f} GiB)")


def _route_options(route: str, source: Path) -> list[str]:
    if route == "full":
        return []
    if route == "fsdp":
        return ["--fsdp"]
    if route == "lora":
        return ["--lora"]
    if route.startswith("lora-x"):
        import headprune_cli

        return [
            "--lora",
            "--lr",
            f"{headprune_cli.default_lr(headprune_cli.load(source)) * float(route[len('lora-x') :]):g}",
        ]
    raise SystemExit(f"unknown finetune route {route!r} (full, lora, lora-xN, fsdp)")


def decode_rows(bench: Bench, repeats: int, context: int = 512) -> list[dict]:
    """Uniform cuts exported as plain transformers folders, decode beside the prediction."""
    from transformers import AutoModelForCausalLM

    from headprune_cli import serving

    base = AutoModelForCausalLM.from_pretrained(bench.summary["hf_folder"], local_files_only=True).eval()
    results = []
    for row in [
        r
        for r in bench.rows
        if "uniform" in r.label and r.label.endswith("lstsq") and r.section in ("kv", "ffn", "both", "joint")
    ]:
        folder = Path(row.extra["checkpoint"]).with_suffix(".hf")
        bench.headprune("export", row.extra["checkpoint"], "--hf", str(folder), "--force")
        pruned = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True).eval()
        for batch in (1, 8):
            predicted = serving.decode_prediction(base, pruned, serving.Generation(batch, context, 16))
            measured = serving.measure_decode(base, pruned, predicted, bench.threads, repeats, 1)
            results.append(
                {
                    "label": f"{row.section} {row.label}",
                    "batch": batch,
                    "predicted_decode": predicted["predicted_decode_speedup"],
                    "tokens_per_s": measured["decode_tokens_per_s"],
                    "decode_speedup": measured["decode_speedup"],
                    "export": bench.shown(["export", row.extra["checkpoint"], "--hf", str(folder)]),
                }
            )
            log(
                f"decode {row.label} batch {batch}: {measured['decode_tokens_per_s']} predicted "
                f"{predicted['predicted_decode_speedup']:.2f}x"
            )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--apt-lists", type=Path, help="as for make_trained_lm (the model is built or found in the cache)"
    )
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="small")
    parser.add_argument(
        "--quick", action="store_true", help="the tiny recipe, one cut per section: a check of this script"
    )
    parser.add_argument("--cache", type=Path, default=default_cache())
    parser.add_argument("--work", type=Path, default=Path("/tmp/trained-lm-bench"))
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--peer-python", help="python of a venv with torch-pruning (the peer rows need it)")
    parser.add_argument(
        "--keeps", default="0.80,0.50", help="fractions of all parameters to keep (the budgets of the kv-free sections)"
    )
    parser.add_argument("--eval-docs", type=int, default=1000)
    parser.add_argument("--finetune-docs", type=int, default=2000)
    parser.add_argument(
        "--finetune-routes", default="full", help="full, lora, lora-xN (N x the default rate), fsdp; comma-separated"
    )
    parser.add_argument("--decode-repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    recipe = "tiny" if args.quick else args.recipe
    summary = build(debian_documents(args.apt_lists), RECIPES[recipe], 0, 2, args.cache, log)
    summary = with_paths(summary, args.cache / summary["key"])
    bench = Bench(summary, args.work.resolve(), args.eval_docs, args.threads)
    base_ppl, _ = bench.perplexity(bench.model_path)
    chosen = args.sections.split(",")
    quick = args.quick
    keeps = tuple(args.keeps.split(","))
    started = time.perf_counter()
    if "kv" in chosen:
        kv_rows(bench, ("0.90",) if quick else ("0.95", "0.90"))
    if "ffn" in chosen:
        ffn_rows(bench, ("0.80",) if quick else keeps)
    if "both" in chosen:
        both_rows(bench, ("0.80",) if quick else keeps)
    if "layers" in chosen:
        layer_rows(bench, ("1",) if quick else ("2", "3"))
    if "joint" in chosen:
        joint_rows(bench, ("0.80",) if quick else keeps)
    if "peer" in chosen and args.peer_python:
        peer_rows(bench, args.peer_python, ("0.80",) if quick else keeps)
    if "finetune" in chosen:
        routes = tuple(args.finetune_routes.split(","))
        finetune_rows(bench, args.finetune_docs, "0.80" if quick else keeps[-1], routes)
    decode = decode_rows(bench, args.decode_repeats, 64 if quick else 512) if "decode" in chosen else []
    result = {
        "model": summary,
        "baseline_perplexity": base_ppl,
        "baseline_parameters": bench.base_params,
        "eval_docs": args.eval_docs,
        "rows": [asdict(r) for r in bench.rows],
        "decode": decode,
        "failures": bench.failures,
        "seconds": round(time.perf_counter() - started, 1),
        "load_after": os.getloadavg(),
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    from scripts.benchmarks.trained_lm_report import markdown

    print(markdown(result))


if __name__ == "__main__":
    main()
