"""Quality at depth on a real labelled task: heads only, layers only and joint selection.

The task is scripts/tools/make_debian_task.py's (all-MiniLM-L6-v2 fine-tuned to tell the
Debian section of a package from its description; cached outside git). For every cut:
score once on the calibration split (taylor heads; cosine, loo and refit layers), select,
remove physically, measure dev accuracy, recover for one epoch with `finetune`'s defaults
(distilling from the unpruned model, as `finetune --teacher auto`), measure it again.
Latency of every pruned model and the baseline is measured interleaved in one loop.

Two tables (markdown on stdout, and --out FILE):
- layer importance: which layers each layer method drops (2 of 6), accuracy before and
  after recovery; the same on a second model (--second: another checkpoint of the task,
  e.g. `scripts/tools/make_debian_task.py --seed 1`; and the bundled examples/demo model,
  1 of 4 layers);
- the trade-off: accuracy drop vs measured speedup for heads-only (`budget`), layers-only
  (`--drop-layers N`) and `joint` (`--target-flops F`), before and after recovery.

Usage: nice python -m scripts.benchmarks.depth [--cache DIR] [--out FILE] [--only layers|curve]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

from headprune_cli import (
    Budget,
    Constraints,
    FinetuneConfig,
    Scores,
    ScoreTable,
    UsageError,
    apply_plan,
    default_lr,
    evaluate,
    load,
    max_sequence,
    read_data,
    score_model,
    scores_artifact,
    select,
    synthetic_inputs,
)
from headprune_cli import measure_latency as measure
from headprune_cli import predict_cost as predict
from headprune_cli import train as finetune

ROOT = Path(__file__).resolve().parents[2]

LAYER_METHODS = ("cosine", "loo", "refit")


def log(*parts) -> None:
    print(time.strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)


def accuracy(model, dev) -> float:
    return 100.0 * next(m.value for m in evaluate(model, dev, "classification") if m.name == "accuracy")


class Task:
    """A model, its data, and its scores: everything a cut needs."""

    def __init__(self, checkpoint: Path, folder: Path, max_length: int, samples: int, train_file: str = "train.jsonl"):
        self.model = load(checkpoint).eval()
        self.checkpoint, self.calib_path = checkpoint, folder / "calib.jsonl"
        self.max_length = max_length
        read = lambda name, **kw: read_data(folder / name, self.model, max_length=max_length, **kw)  # noqa: E731
        self.calib = read("calib.jsonl", samples=samples)
        self.dev = read("dev.jsonl")
        self.train = read(train_file, seed=0)
        self.base = accuracy(self.model, self.dev)
        self.tables: dict[str, ScoreTable] = {}
        self.score_seconds: dict[str, float] = {}
        self.cuts: dict[str, dict] = {}

    def table(self, layer_method: str) -> ScoreTable:
        """Scores as `headprune score` writes them, read back as `select` reads them."""
        if layer_method not in self.tables:
            start = time.time()
            result = score_model(self.model, self.calib, "taylor", layers=layer_method, batch_size=32)
            self.score_seconds[layer_method] = time.time() - start
            artifact = scores_artifact(
                self.model, result, model_path=self.checkpoint, data_path=self.calib_path, max_length=self.max_length
            )
            self.tables[layer_method] = ScoreTable.from_scores(Scores.model_validate(artifact))
        return self.tables[layer_method]

    def cut(
        self,
        remove_heads: dict,
        remove_layers: list,
        lr: float | None = None,
        epochs: int = 1,
        steps: int | None = None,
    ) -> dict:
        """Prune a copy, evaluate, recover, evaluate (memoised: tables share their cuts)."""
        key = json.dumps(
            [sorted((int(k), sorted(v)) for k, v in remove_heads.items()), sorted(remove_layers), lr, epochs, steps]
        )
        if key not in self.cuts:
            self.cuts[key] = self._cut(remove_heads, remove_layers, lr, epochs, steps)
        return dict(self.cuts[key])

    def _cut(self, remove_heads, remove_layers, lr, epochs, steps) -> dict:
        pruned = apply_plan(copy.deepcopy(self.model), remove_heads, remove_layers)
        before = accuracy(pruned, self.dev)
        if epochs == 0 and not steps:  # no recovery: the cut alone
            return {"model": pruned, "before": before, "after": float("nan"), "lr": 0.0, "seconds": 0.0, "steps": 0}
        cfg = FinetuneConfig(epochs=None if steps else epochs, steps=steps, lr=lr, seed=0)
        start = time.time()
        result = finetune(pruned, self.train, cfg, teacher=self.model)
        after = accuracy(result.model, self.dev)
        return {
            "model": result.model,
            "before": before,
            "after": after,
            "lr": result.lr,
            "seconds": time.time() - start,
            "steps": result.steps,
        }


def layer_table(task: Task, name: str, drop: int, methods=LAYER_METHODS, steps: int | None = None) -> list[dict]:
    rows = []
    for method in methods:
        t = task.table(method)
        chosen = select(
            t, "global", budget=Budget("heads", 0.0), constraints=Constraints(drop_layers=drop)
        ).remove_layers
        log(name, method, "drops", chosen)
        r = task.cut({}, chosen, steps=steps)
        rows.append(
            {
                "model": name,
                "method": method,
                "scores": {k: round(v, 4) for k, v in t.layers.items()},
                "dropped": chosen,
                "base": task.base,
                "before": r["before"],
                "after": r["after"],
                "lr": r["lr"],
                "score_s": task.score_seconds[method],
            }
        )
    return rows


def curve(task: Task, layer_method: str, budgets: list[float], drops: list[int], epochs: int = 1) -> list[dict]:
    t = task.table(layer_method)
    full = predict(t.cost, t.kept())["flops_per_token"]
    cuts = []
    for f in budgets:
        try:  # heads alone reach only so far (softmax, FFN and embeddings stay)
            cuts.append(
                (
                    "heads only",
                    f"budget --target-flops {f}",
                    select(t, "budget", budget=Budget("flops", f), constraints=Constraints(min_heads=1)),
                )
            )
        except UsageError as exc:
            log("heads only", f, "skipped:", exc)
        cuts.append(("joint", f"joint --target-flops {f}", select(t, "joint", budget=Budget("flops", f))))
    for n in drops:
        cuts.append(
            (
                "layers only",
                f"--drop-layers {n}",
                select(t, "global", budget=Budget("heads", 0.0), constraints=Constraints(drop_layers=n)),
            )
        )
    rows, models = [], {"baseline": task.model}
    for kind, how, sel in cuts:
        log(kind, how, "layers", sel.remove_layers, "heads", sum(map(len, sel.remove_heads.values())))
        r = task.cut(sel.remove_heads, sel.remove_layers, epochs=epochs)
        name = f"{kind}: {how}"
        models[name] = r.pop("model")
        after = predict(t.cost, t.kept(), sel.remove_heads, sel.remove_layers)["flops_per_token"]
        rows.append(
            {
                "kind": kind,
                "how": how,
                "layers": sel.remove_layers,
                "heads": sum(map(len, sel.remove_heads.values())),
                "predicted": full / after,
                "base": task.base,
                **r,
                "name": name,
            }
        )
    log("latency of", len(models), "models")
    seq = min(128, max_sequence(task.model) or 128)
    inputs = {n: synthetic_inputs(m, 16, seq)[0] for n, m in models.items()}
    lat = measure(models, inputs, repeats=7, warmup=1)
    for row in rows:
        row["measured"] = lat["baseline"].median_ms / lat[row["name"]].median_ms
        row["ms"] = lat[row["name"]].median_ms
    rows.append({"baseline_ms": lat["baseline"].median_ms})
    return rows


def markdown_layers(rows: list[dict]) -> str:
    out = [
        "| model | layer method | layer scores | dropped | accuracy before recovery | after 1 epoch | "
        "drop after (points) | lr | scoring s |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        scores = ", ".join(f"{v:.3g}" for v in r["scores"].values())
        out.append(
            f"| {r['model']} | {r['method']} | {scores} | {r['dropped']} | {r['before']:.2f} | {r['after']:.2f} | "
            f"{r['after'] - r['base']:+.2f} | {r['lr']:g} | {r['score_s']:.0f} |"
        )
    return "\n".join(out)


def markdown_curve(rows: list[dict]) -> str:
    base = rows[-1]["baseline_ms"]
    out = [
        f"Baseline {rows[0]['base']:.2f}% dev accuracy, {base:.0f} ms per batch of 16 x 128 tokens.",
        "",
        "| selection | how | layers dropped | heads removed | predicted speedup | measured speedup | "
        "drop before recovery | drop after 1 epoch | recovery s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows[:-1], key=lambda r: (r["kind"], r["predicted"])):
        out.append(
            f"| {r['kind']} | `{r['how']}` | {r['layers']} | {r['heads']} | "
            f"{r['predicted']:.2f}x | {r['measured']:.2f}x | "
            f"{r['before'] - r['base']:+.2f} | {r['after'] - r['base']:+.2f} | {r['seconds']:.0f} |"
        )
    return "\n".join(out)


def main() -> None:
    from scripts.tools.make_debian_task import MAX_LENGTH, default_cache

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=default_cache())
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", choices=("layers", "curve", "lr"), default=None)
    parser.add_argument("--samples", type=int, default=256, help="Calibration rows for scoring.")
    parser.add_argument("--second", type=Path, default=None, help="A second checkpoint of the task (another seed).")
    parser.add_argument("--budgets", default="0.8,0.7,0.6,0.5")
    parser.add_argument(
        "--epochs", type=int, default=1, help="Recovery epochs per cut of the curve (0: the cut alone)."
    )
    parser.add_argument("--drops", default="1,2,3")
    parser.add_argument(
        "--layer-method", default="loo", help="Layer scores the curve's joint and layers-only rows use."
    )
    parser.add_argument(
        "--layer-methods", default=",".join(LAYER_METHODS), help="Layer methods the comparison table runs."
    )
    args = parser.parse_args()
    torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", "2")))

    task = Task(args.cache / "model.safetensors", args.cache, MAX_LENGTH, args.samples)
    log("baseline accuracy", task.base)
    parts, results = [], {"baseline": task.base}
    methods = tuple(args.layer_methods.split(","))
    if args.only in (None, "curve"):
        rows = curve(
            task,
            args.layer_method,
            [float(x) for x in args.budgets.split(",")],
            [int(x) for x in args.drops.split(",")],
            args.epochs,
        )
        results["curve"] = [{k: v for k, v in r.items() if k != "model"} for r in rows]
        parts.append(markdown_curve(rows))
        emit(args, parts, results)
    if args.only in (None, "layers"):
        rows = layer_table(task, "MiniLM debian-sections", 2, methods)
        if args.second:
            second = Task(args.second, args.cache, MAX_LENGTH, args.samples)
            rows += layer_table(second, "MiniLM debian-sections (seed 1)", 2, methods)
        demo = Task(ROOT / "examples/demo/model.safetensors", ROOT / "examples/demo", 32, 256)
        rows += layer_table(demo, "examples/demo (4 layers)", 1, methods, steps=60)
        rows += layer_table(demo, "examples/demo (4 layers)", 2, methods, steps=60)
        results["layers"] = rows
        parts.append(markdown_layers(rows))
        emit(args, parts, results)
    if args.only in (None, "lr"):
        t = task.table(args.layer_method)
        chosen = select(t, "global", budget=Budget("heads", 0.0), constraints=Constraints(drop_layers=2)).remove_layers
        base_lr = default_lr(task.model)
        lrs = []
        for lr in (base_lr, 3 * base_lr, 10 * base_lr):
            r = task.cut({}, chosen, lr=lr)
            lrs.append({"lr": lr, "before": r["before"], "after": r["after"]})
            log("lr", lr, r["after"])
        results["lr"] = lrs
        parts.append(
            "| lr | x table rate | accuracy after 1 epoch | drop (points) |\n|---:|---:|---:|---:|\n"
            + "\n".join(
                f"| {r['lr']:g} | {r['lr'] / base_lr:g} | {r['after']:.2f} | {r['after'] - task.base:+.2f} |"
                for r in lrs
            )
        )
    emit(args, parts, results)


def emit(args, parts: list[str], results: dict) -> None:
    """Print and write what is measured so far (a long run leaves its tables as it goes)."""
    text = "\n\n".join(parts) + "\n"
    print(text, flush=True)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
