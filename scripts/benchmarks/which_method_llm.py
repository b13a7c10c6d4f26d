"""Published LLM pruning methods against headprune's routes on one real LLM, without training.

Every route cuts the same checkpoint to the same share of the FLOPs per token (each of
--targets), or with --budget block-params to the same share of the parameters inside the
transformer blocks (`--target-block-params`, the papers' "non-embedding parameters"), and is
judged by perplexity on held-out text that no route reads:
- flap, wanda-sp, minitron, llm-pruner: `score --method M --ffn` on the calibration rows,
  then `prune --scores --target-flops T` (the budget greedy over heads and FFN neurons);
  no compensation (FLAP's own bias compensation needs a bias LLaMA projections lack);
- shortgpt: `score --layers --layer-method cosine` (block influence), then the fewest
  whole layers, least influential first (`prune --ratio 0 --drop-layers N`), that meet T;
- METHOD+lstsq: the same cut with headprune's lstsq compensation on the calibration rows;
  METHOD@uniform: every layer keeps the same widths (`--uniform`), the per-layer ratio of
  the Wanda-sp, LLM-Pruner and Minitron papers; @rows=N and @ridge=R (any route with lstsq)
  refit on N calibration rows, with ridge R;
- obs+lstsq: headprune's structured OBS scores (`score --method obs --ffn`, the units the
  refit repairs best) with the lstsq refit; METHOD:KEY=VALUE passes `--METHOD-KEY VALUE` to
  score (obs:score=marginal:norm=residual+lstsq);
- default: headprune's documented route, `score --ffn` (fisher) and
  `prune --target-flops T --data CALIB` (lstsq compensation, the default with --data);
- iterate: `iterate --ffn --target-flops T --recover lstsq` (rescoring between rounds);
- torch-pruning: Torch-Pruning's own LLM pruning run from its PyPI package on the HF folder
  (FFN only: its head pruning fails on 9 query / 3 KV heads, see route_torch_pruning).
Each route's rows are appended to OUT/results.jsonl as they finish (a rerun skips what is
there), and OUT/table.md is rendered from them. CLI subprocesses and headprune_cli's public
API only.

Usage:
  python scripts/benchmarks/which_method_llm.py --model /work/models/smollm2.safetensors \
      --calib /work/corpus/calib.txt --heldout /work/corpus/heldout.txt --out runs/which-method
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import headprune_cli as hp

PUBLISHED = ("flap", "wanda-sp", "minitron", "llm-pruner")
BUDGETS = ("flops", "block-params")  # --budget: the CLI's --target-flops or --target-block-params


def headprune(*args) -> str:
    """Run one CLI command; its stdout (a JSON artifact when no -o is given)."""
    done = subprocess.run([sys.executable, "-m", "headprune_cli", *map(str, args)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"headprune {' '.join(map(str, args[:2]))} failed: {done.stderr.strip()[-800:]}")
    return done.stdout


def measure(path: Path, heldout: Path, rows: int, base: dict | None) -> dict:
    """Perplexity on the held-out rows, parameters and FLOPs per token of one checkpoint."""
    model = hp.load(path)
    data = hp.read_data(heldout, model, max_length=128, samples=rows)
    metrics = {m.name: m.value for m in hp.evaluate(model, data, "causal-lm", batch_size=8)}
    out = {"ppl": metrics["perplexity"], "params": hp.count_params(model), "flops": hp.flops_per_token(model, 128)}
    if base is not None:
        out.update(x_ppl=out["ppl"] / base["ppl"], flops_share=out["flops"] / base["flops"])
    return out


class Bench:
    def __init__(self, args):
        self.args, self.out = args, Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.results = self.out / "results.jsonl"
        self.budget, self.flag = args.budget, f"--target-{args.budget}"
        self.done = {(r["route"], r["target"], r.get("budget", "flops")) for r in self.rows()}
        self.base = next((r for r in self.rows() if r["route"] == "unpruned"), None)

    def rows(self) -> list[dict]:
        return [json.loads(line) for line in self.results.read_text().splitlines()] if self.results.exists() else []

    def record(self, route: str, target: float, path: Path, started: float) -> None:
        row = {"route": route, "target": target, **measure(path, self.args.heldout, self.args.eval_rows, self.base)}
        if self.budget != "flops":  # rows of the FLOPs budget keep the keys they always had
            row["budget"] = self.budget
        row["seconds"] = round(time.time() - started, 1)
        with self.results.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), file=sys.stderr, flush=True)
        if path != self.args.model:
            path.unlink()  # a SmolLM2 cut is half a gigabyte; the row is what is kept

    def calib(self) -> list:
        return ["--data", self.args.calib, "--samples", self.args.calib_rows, "--max-length", 128]

    def scores(self, name: str, *extra) -> Path:
        path = self.out / f"scores-{name}.json"
        if not path.exists():
            headprune("score", self.args.model, *self.calib(), "--batch-size", 8, *extra, "-o", path)
        return path

    def run(self) -> None:
        a = self.args
        if self.base is None:
            self.record("unpruned", 1.0, a.model, time.time())
            self.base = self.rows()[0]
        for target in a.targets:
            for route in a.routes:
                if (route, target, self.budget) not in self.done:
                    started = time.time()
                    if route == "torch-pruning":
                        route_torch_pruning(self, route, target, started)
                    else:
                        base = route.partition("@")[0]
                        getattr(self, "route_" + base.replace("-", "_"), self.published)(route, target, started)

    def published(self, route: str, target: float, started: float) -> None:
        """METHOD[+COMPENSATION][@uniform]: the method's cut, with headprune's compensation on the
        calibration rows, and with every layer keeping the same widths (the papers' uniform ratio)."""
        name = route.partition("@")[0]
        spec, _, compensation = name.partition("+")
        method, *settings = spec.split(":")
        options = [a for kv in settings for a in (f"--{method}-{kv.partition('=')[0]}", kv.partition("=")[2])]
        scores = self.scores(spec, "--method", method, "--ffn", *options)
        cut = self.out / f"{method}-{target}.safetensors"
        extra = [*self.calib(), "--compensate", compensation] if compensation else []
        headprune(
            "prune", self.args.model, "--scores", scores, self.flag, target, *extra, *self.prune_flags(route),
            "-o", cut, "--force",
        )  # fmt: skip
        self.record(route, target, cut, started)

    def prune_flags(self, route: str) -> list:
        """A route's @FLAG suffixes as prune options: @uniform, @rows=N (calibration rows of the
        lstsq refit, instead of --calib-rows), @ridge=R (the refit's ridge)."""
        flags: list = []
        for part in route.split("@")[1:]:
            key, _, value = part.partition("=")
            if key == "uniform":
                flags.append("--uniform")
            elif key == "rows":
                flags += ["--samples", value]  # the later --samples wins over calib()'s
            elif key == "ridge":
                flags += ["--ridge", value]
            else:
                raise SystemExit(f"unknown route flag @{part} in {route}")
        return flags

    def route_default(self, route: str, target: float, started: float) -> None:
        scores = self.scores("fisher", "--ffn")
        cut = self.out / f"default-{target}.safetensors"
        headprune(
            "prune", self.args.model, "--scores", scores, self.flag, target, *self.calib(),
            *self.prune_flags(route), "-o", cut, "--force",
        )  # fmt: skip
        self.record(route, target, cut, started)

    def route_shortgpt(self, route: str, target: float, started: float) -> None:
        scores = self.scores("cosine", "--method", "random", "--layers", "--layer-method", "cosine")
        for drop in range(1, 30):
            plan = json.loads(headprune("select", scores, "--ratio", 0, "--drop-layers", drop))
            if kept_share(plan["predicted"], self.budget, outside_params(scores)) <= target:
                break
        cut = self.out / f"shortgpt-{target}.safetensors"
        headprune(
            "prune", self.args.model, "--scores", scores, "--ratio", 0, "--drop-layers", drop, "-o", cut, "--force"
        )  # noqa: E501
        self.record(route, target, cut, started)

    def route_iterate(self, route: str, target: float, started: float) -> None:
        cut = self.out / f"iterate-{target}.safetensors"
        schedule = ",".join(str(round(1 - (1 - target) * k / 2, 4)) for k in (1, 2))  # two rounds
        # iterate evaluates its whole --eval-data after every step: the calibration rows only
        # (all 286 lines of calib.txt took 77 minutes on 2 loaded cores)
        dev = self.out / "iterate-dev.txt"
        lines = self.args.calib.read_text(encoding="utf-8").splitlines()
        dev.write_text("\n".join(lines[: self.args.calib_rows]) + "\n", encoding="utf-8")
        headprune(
            "iterate", self.args.model, *self.calib(), "--eval-data", dev, "--ffn",
            self.flag, schedule, "--recover", "lstsq", "-o", cut, "--force",
        )  # fmt: skip
        self.record(route, target, cut, started)


def outside_params(scores: Path) -> int:
    """The params outside the blocks (embeddings, tied head, final norm), from the scores' cost table."""
    return int(json.loads(scores.read_text())["cost"]["outside_params"])


def kept_share(predicted: dict, budget: str, outside: int) -> float:
    """The share of the budget's cost a plan keeps (predict()'s before and after)."""
    before, after = predicted["before"], predicted["after"]
    if budget == "flops":
        return after["flops_per_token"] / before["flops_per_token"]
    return (after["params"] - outside) / (before["params"] - outside)


def route_torch_pruning(bench: Bench, route: str, target: float, started: float) -> None:
    """Torch-Pruning's own LLM pruning (its PyPI package; the method of its examples/LLMs/prune_llm.py:
    BasePruner, GroupMagnitudeImportance(p=2, mean), one ratio in every layer, round_to=4, lm_head
    ignored) on the HF folder the checkpoint was imported from, then imported back and measured alike.
    Its head pruning stops on SmolLM2's 9 query / 3 KV heads (1.6.1: "shape '[9, -1]' is invalid
    for input of size 192", with or without prune_num_heads), so the attention projections are
    ignored too and it cuts the FFN, at the ratio that removes (1 - T) of the FLOPs per token."""
    import torch
    import torch_pruning as tp
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from scripts.benchmarks.trained_lm_peer import traceable_rotary

    traceable_rotary()  # the same function, in a form its tracer does not loop on (see there)
    folder, cut = bench.out / f"tp-{target}", bench.out / f"torch-pruning-{target}.safetensors"
    model = AutoModelForCausalLM.from_pretrained(bench.args.hf_folder, local_files_only=True).eval()
    c = model.config
    ffn_flops = 2 * 3 * c.hidden_size * c.intermediate_size * c.num_hidden_layers
    if bench.budget == "flops":
        ratio = (1 - target) * bench.base["flops"] / ffn_flops
    else:  # the FFN's params are its FLOPs / 2 per token; the blocks' are the model's less the outside
        blocks = bench.base["params"] - outside_params(bench.out / "scores-fisher.json")
        ratio = (1 - target) * blocks / (ffn_flops / 2)
    attention = [getattr(b.self_attn, n) for b in model.model.layers for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
    example = torch.tensor([Tokenizer.from_file(f"{bench.args.hf_folder}/tokenizer.json").encode("Hello world.").ids])
    pruner = tp.pruner.BasePruner(
        model,
        example_inputs=example,
        importance=tp.importance.GroupMagnitudeImportance(p=2, group_reduction="mean"),
        global_pruning=False,
        output_transform=lambda x: x.logits,
        pruning_ratio=ratio,
        ignored_layers=[model.lm_head, *attention],
        round_to=4,
    )
    for group in pruner.step(interactive=True):
        group.prune()
    model.config.intermediate_size = model.model.layers[0].mlp.gate_proj.out_features
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((bench.args.hf_folder / name).read_bytes())
    headprune("import", folder, "-o", cut, "--force")
    bench.record(route, target, cut, started)


def render(rows: list[dict], outside: int | None = None) -> str:
    """One Markdown table: a row per route, a column per budget and target (perplexity, x
    unpruned, the share of the column's cost kept); `outside`: the params outside the blocks."""
    base = next(r for r in rows if r["route"] == "unpruned")
    columns = sorted(
        {(r.get("budget", "flops"), r["target"]) for r in rows if r["route"] != "unpruned"},
        key=lambda c: (BUDGETS.index(c[0]), -c[1]),
    )
    cells = {(r["route"], r.get("budget", "flops"), r["target"]): r for r in rows}
    routes = list(dict.fromkeys(r["route"] for r in rows if r["route"] != "unpruned"))

    def share(c: dict, budget: str) -> float:
        if budget == "flops":
            return c["flops_share"]
        assert outside is not None  # block-params rows are made with the scores that hold it
        return (c["params"] - outside) / (base["params"] - outside)

    names = {"flops": "FLOPs", "block-params": "block params"}
    lines = [
        "| route | " + " | ".join(f"{t:g} of the {names[b]}" for b, t in columns) + " |",
        "|---|" + "---:|" * len(columns),
        f"| unpruned | {base['ppl']:.1f} (1.00x) |" + " |" * (len(columns) - 1),
    ]
    for route in routes:
        found = [(cells.get((route, b, t)), b) for b, t in columns]
        text = [f"{c['ppl']:.1f} ({c['x_ppl']:.2f}x, {share(c, b):.3f})" if c else "-" for c, b in found]
        lines.append(f"| {route} | " + " | ".join(text) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--calib", type=Path, required=True)
    parser.add_argument("--heldout", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hf-folder", type=Path, help="torch-pruning: the HF folder MODEL was imported from")
    parser.add_argument("--calib-rows", type=int, default=32)
    parser.add_argument("--eval-rows", type=int, default=64)
    parser.add_argument("--targets", type=lambda s: [float(v) for v in s.split(",")], default=[0.8, 0.9, 0.7, 0.5])
    parser.add_argument("--budget", choices=BUDGETS, default="flops", help="what each target is a share of")
    parser.add_argument("--routes", type=lambda s: s.split(","), default=["default", *PUBLISHED, "shortgpt", "iterate"])
    parser.add_argument("--render", action="store_true", help="only write OUT/table.md from OUT/results.jsonl")
    args = parser.parse_args()
    bench = Bench(args)
    if not args.render:
        bench.run()
    fisher = bench.out / "scores-fisher.json"
    (bench.out / "table.md").write_text(render(bench.rows(), outside_params(fisher) if fisher.exists() else None))
    print((bench.out / "table.md").read_text())


if __name__ == "__main__":
    main()
