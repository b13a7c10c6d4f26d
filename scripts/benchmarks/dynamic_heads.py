"""Dynamic (input-dependent) heads against a static cut with the same average head count
(issue #39 part 3), on the Debian-sections classifiers (MiniLM, 6 layers x 12 heads, 32 tokens).

Per model and kept share S (the average share of the 72 heads each input runs):
  full       the unpruned model
  static     score --method fisher (calib.jsonl) -> select --ratio 1-S -> prune --compensate lstsq
  uniform    the same with select --uniform (S x 12 heads in every layer)
  gates-0    per-layer gates before training: every input runs its layer's static top-k of the fisher
             scores; a skipped head adds its mean output (over calib.jsonl) to the output projection
  gates      the same gates trained (model frozen; KD = KL to the full model; train.jsonl, batch 16;
             straight-through hard top-k); inference is the hard top-k, exactly S x 12 heads per layer
  routed     a router (logistic regression on the mean embedding output) sends each input to one of
             nested static widths (kept shares WIDTHS, each a fisher + lstsq cut sharing the full
             model's Q/K/V, FFN and embedding storage; only the output projection is the width's own);
             its threshold is set on train.jsonl so that the average head count is at most S x 72
  oracle     the same widths, each dev input sent to the narrowest width that agrees with the full
             model (the ceiling of any router; uses the dev labels' teacher, so not deployable)
Dev accuracy (dev.jsonl, 471 rows) for each; then latency on CPU, every variant through the same
functional forward (scripts/benchmarks/dynamic_gates.py), interleaved in one loop: batch 1 (each dev
input alone) and batch 16 (the dev batches; per-head gating groups rows by head subset per layer,
routing groups rows by width). `gates-mask` is the gated model computing every head and masking.

Usage (from the repository root; BENCHMARKS.md section 24 has the run it records):
  OMP_NUM_THREADS=1 nice -n 10 python -m scripts.benchmarks.dynamic_heads --work /tmp/dyn --seeds 0 1 \
      --shares 0.5 0.25 --json /tmp/dyn/rows.json
  python -m scripts.benchmarks.dynamic_heads --tables-from /tmp/dyn/rows.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from scripts.benchmarks import dynamic_gates as dg
from scripts.benchmarks.debian_task import LENGTH, debian_task, run_prune_lstsq, run_score, run_select

WIDTHS = (0.25, 0.5, 0.75, 1.0)


def scores(t: dict, folder: Path) -> Path:
    return run_score(t, folder / "scores-fisher.json", "fisher")


def static_cut(t: dict, folder: Path, share: float, uniform: bool) -> Path:
    """select --ratio 1-share (fisher) [--uniform] -> prune --compensate lstsq --data calib.jsonl."""
    name = f"{'uniform' if uniform else 'static'}-{share}"
    plan, out = folder / f"plan-{name}.json", folder / f"{name}.safetensors"
    if not plan.is_file():
        run_select(scores(t, folder), plan, ratio=round(1 - share, 6), **({"uniform": True} if uniform else {}))
    return run_prune_lstsq(t, plan, out)


def batches_of(path: Path, model, size: int) -> list[dict]:
    from headprune_cli.data.readers import batches, read_data  # noqa: PLC0415 (headprune loads after argument checks)

    return list(batches(read_data(path, model, max_length=LENGTH), size))


def accuracy(forward, data: list[dict]) -> float:
    right = total = 0
    with torch.no_grad():
        for batch in data:
            right += int((forward(batch).argmax(-1) == batch["labels"]).sum())
            total += len(batch["labels"])
    return 100 * right / total


def kept_heads(plan_path: Path, heads: int, layers: int) -> list[list[int]]:
    removed = json.loads(plan_path.read_text())["remove_heads"]
    return [sorted(set(range(heads)) - set(removed.get(str(layer), []))) for layer in range(layers)]


class Setup:
    """Everything one model needs, built once: data, the full encoder, teacher logits, fisher scores."""

    def __init__(self, t: dict, folder: Path):
        from headprune_cli import load  # noqa: PLC0415 (headprune loads after argument checks)

        self.t, self.folder, self.load = t, folder, load
        self.model = load(t["model"]).eval()
        self.full = dg.encoder_of(self.model)
        self.heads, self.layers = self.full.layers[0].heads, len(self.full.layers)
        self.train = batches_of(t["train"], self.model, 16)
        self.dev = batches_of(t["dev"], self.model, 16)
        self.calib = batches_of(t["calib"], self.model, 32)
        with torch.no_grad():
            self.teacher = [dg.encode(self.full, b) for b in self.train]
            reference = self.model(**{k: v for k, v in self.dev[0].items() if k != "labels"}).logits
            gap = float((reference - dg.encode(self.full, self.dev[0])).abs().max())
        assert gap < 1e-4, f"the functional forward departs from the model by {gap}"
        s = json.loads(scores(t, folder).read_text())["heads"]
        self.scores = [[s[str(layer)][str(h)] for h in range(self.heads)] for layer in range(self.layers)]
        self.comp = dg.compensation_vectors(self.full, self.calib)

    def encoder(self, path: Path) -> dg.Encoder:
        return dg.encoder_of(self.load(path).eval())


def gate_models(setup: Setup, keep: int, epochs: int, lr: float) -> tuple[dg.Gates, dg.Gates, list[float]]:
    dg.check_budget(keep, setup.heads)
    before = dg.Gates(setup.scores, setup.full.layers[0].qkv.shape[-1])
    trained = dg.Gates(setup.scores, setup.full.layers[0].qkv.shape[-1])
    path = setup.folder / f"gates-{keep}-e{epochs}-lr{lr}.pt"
    if path.is_file():
        trained.load_state_dict(torch.load(path, weights_only=True))
        history = json.loads(path.with_suffix(".json").read_text())
    else:
        history = dg.train_gates(
            setup.full, trained, setup.comp, setup.train, setup.teacher, keep, epochs, lr, setup.t["seed"]
        )
        torch.save(trained.state_dict(), path)
        path.with_suffix(".json").write_text(json.dumps(history))
    return before.eval(), trained.eval(), history


class Widths:
    """Nested fisher + lstsq widths that share the full model's storage, and a router among them."""

    def __init__(self, setup: Setup):
        plans = [static_cut(setup.t, setup.folder, w, False) for w in WIDTHS[:-1]]
        kept = [
            kept_heads(p.parent / f"plan-static-{w}.json", setup.heads, setup.layers)
            for p, w in zip(plans, WIDTHS, strict=False)
        ]
        kept.append([list(range(setup.heads))] * setup.layers)
        orders = dg.nested_orders(kept, setup.heads)
        assert orders is not None, "the fisher cuts at the widths' shares are not nested"
        base = dg.reorder(setup.full, orders)
        self.models = [dg.width_view(base, orders, setup.encoder(p)) for p in plans] + [base]
        for w, p in zip(self.models[:-1], plans, strict=True):  # the views reproduce the pruned checkpoints
            with torch.no_grad():
                gap = float((dg.encode(w, setup.dev[0]) - dg.encode(setup.encoder(p), setup.dev[0])).abs().max())
            assert gap < 1e-4, f"a width view departs from its pruned checkpoint by {gap}"
        self.cost = [sum(layer.heads for layer in m.layers) for m in self.models]
        with torch.no_grad():
            feats, agree = [], []
            for batch, teacher in zip(setup.train, setup.teacher, strict=True):
                feats.append(dg.pooled(dg.embed(setup.full, batch), batch["attention_mask"]))
                target = teacher.argmax(-1)
                agree.append(torch.stack([(dg.encode(m, batch).argmax(-1) == target) for m in self.models], 1))
        self.feats, self.agree = torch.cat(feats), torch.cat(agree).float()
        self.router = dg.Router(self.feats.shape[1], len(self.models))
        dg.train_router(self.router, self.feats, self.agree, 300, setup.t["seed"])
        self.router.eval()
        self.threshold = 1.01

    def budget(self, heads: float) -> None:
        with torch.no_grad():
            self.threshold = dg.threshold_for(self.router.net(self.feats).sigmoid(), self.cost, heads)

    def picks(self, batch: dict) -> torch.Tensor:
        x0 = dg.embed(self.models[-1], batch)
        return dg.choose(self.router(x0, batch["attention_mask"]), self.threshold)

    def forward(self, batch: dict) -> torch.Tensor:
        """Route, then run each width on its rows (trimmed to their own padding)."""
        picks = self.picks(batch)
        out = torch.empty(len(picks), self.models[-1].classifier.out_features)
        for w in picks.unique().tolist():
            rows = (picks == w).nonzero().squeeze(1)
            part = {k: v[rows] for k, v in batch.items() if k != "labels"}
            width = int(part["attention_mask"].any(0).nonzero().max()) + 1
            out[rows] = dg.encode(self.models[w], {k: v[:, :width] for k, v in part.items()})
        return out

    def oracle(self, batch: dict, teacher: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        preds = torch.stack([dg.encode(m, batch).argmax(-1) for m in self.models], 1)
        ok = preds == teacher.argmax(-1)[:, None]
        ok[:, -1] = True
        pick = ok.float().argmax(1)
        return preds.gather(1, pick[:, None]).squeeze(1), pick


def quality_rows(setup: Setup, widths: Widths, share: float, epochs: int, lr: float) -> tuple[list[dict], dict]:
    keep = round(share * setup.heads)
    total = setup.heads * setup.layers
    static, uniform = (setup.encoder(static_cut(setup.t, setup.folder, share, u)) for u in (False, True))
    before, trained, history = gate_models(setup, keep, epochs, lr)
    widths.budget(share * total)
    dev_picks = torch.cat([widths.picks(b) for b in setup.dev])
    with torch.no_grad():
        oracle_right, oracle_cost = 0, []
        for b in setup.dev:
            pred, pick = widths.oracle(b, dg.encode(setup.full, b))
            oracle_right += int((pred == b["labels"]).sum())
            oracle_cost += [widths.cost[i] for i in pick.tolist()]
    variants = {
        "full": (lambda b: dg.encode(setup.full, b), total),
        "static": (lambda b: dg.encode(static, b), sum(layer.heads for layer in static.layers)),
        "uniform": (lambda b: dg.encode(uniform, b), sum(layer.heads for layer in uniform.layers)),
        "gates-0": (lambda b: dg.gated_skip(setup.full, before, setup.comp, b, keep), keep * setup.layers),
        "gates": (lambda b: dg.gated_skip(setup.full, trained, setup.comp, b, keep), keep * setup.layers),
        "routed": (widths.forward, float(torch.tensor(widths.cost, dtype=torch.float)[dev_picks].mean())),
    }
    with torch.no_grad():  # skipping reproduces masking (the same heads, the same compensation)
        for b in setup.dev[:3]:
            gap = (
                (
                    dg.gated_skip(setup.full, trained, setup.comp, b, keep)
                    - dg.gated_masked(setup.full, trained, setup.comp, b, keep)
                )
                .abs()
                .max()
            )
            assert float(gap) < 1e-4, f"skipping departs from masking by {float(gap)}"
    rows = [
        dict(model=setup.t["name"], share=share, variant=name, heads=heads, accuracy=accuracy(forward, setup.dev))
        for name, (forward, heads) in variants.items()
    ]
    rows.append(
        dict(
            model=setup.t["name"],
            share=share,
            variant="oracle",
            heads=statistics.fmean(oracle_cost),
            accuracy=100 * oracle_right / sum(len(b["labels"]) for b in setup.dev),
        )
    )
    extra = dict(
        gate_loss=history,
        width_heads=widths.cost,
        width_share_dev=[float((dev_picks == i).float().mean()) for i in range(len(widths.cost))],
        threshold=widths.threshold,
    )
    timed = {k: v[0] for k, v in variants.items()}
    timed["gates-mask"] = lambda b: dg.gated_masked(setup.full, trained, setup.comp, b, keep)
    return rows, dict(extra=extra, timed=timed)


def single_rows(data: list[dict]) -> list[dict]:
    """Each dev input alone, trimmed to its own length (batch 1 serving)."""
    out = []
    for batch in data:
        for i in range(len(batch["labels"])):
            mask = batch["attention_mask"][i : i + 1]
            width = int(mask.nonzero()[:, 1].max()) + 1
            out.append({k: v[i : i + 1, :width] for k, v in batch.items() if k != "labels"})
    return out


def latency(timed: dict, data: list[dict], repeats: int) -> dict:
    """Median over `repeats` passes of the mean ms per call; the variants alternate call by call
    (rotating order), so drifting machine load falls on all of them alike."""
    names = list(timed)
    passes: dict[str, list[float]] = {n: [] for n in names}
    with torch.no_grad():
        for batch in data[:4]:  # warm-up
            for n in names:
                timed[n](batch)
        for r in range(repeats):
            spent = dict.fromkeys(names, 0.0)
            for i, batch in enumerate(data):
                order = names[(i + r) % len(names) :] + names[: (i + r) % len(names)]
                for n in order:
                    start = time.perf_counter()
                    timed[n](batch)
                    spent[n] += time.perf_counter() - start
            for n in names:
                passes[n].append(1000 * spent[n] / len(data))
    return {n: statistics.median(v) for n, v in passes.items()}


def run(args) -> list[dict]:
    torch.set_num_threads(args.threads)
    rows: list[dict] = []
    for seed in args.seeds:
        t = debian_task(seed)
        folder = args.work / t["name"]
        folder.mkdir(parents=True, exist_ok=True)
        setup = Setup(t, folder)
        widths = Widths(setup)
        for share in args.shares:
            quality, extra = quality_rows(setup, widths, share, args.epochs, args.lr)
            one = single_rows(setup.dev)[: args.single]
            load = os.getloadavg()[0]
            b1 = latency(extra["timed"], one, args.repeats)
            b16 = latency(extra["timed"], setup.dev, args.repeats)
            load = (load + os.getloadavg()[0]) / 2
            for row in quality:
                row.update(ms_b1=b1.get(row["variant"]), ms_b16=b16.get(row["variant"]))
            quality.append(
                dict(
                    model=t["name"],
                    share=share,
                    variant="gates-mask",
                    heads=quality[4]["heads"],
                    accuracy=quality[4]["accuracy"],
                    ms_b1=b1["gates-mask"],
                    ms_b16=b16["gates-mask"],
                )
            )
            for row in quality:
                row.update(
                    load=load, threads=args.threads, **({"extra": extra["extra"]} if row["variant"] == "routed" else {})
                )
            rows += quality
            print(tables(quality), file=sys.stderr)
            if args.json:  # after every share, so a long run that is stopped keeps what it measured
                args.json.write_text(json.dumps(rows, indent=1))
    return rows


def tables(rows: list[dict]) -> str:
    out = []
    for model, share in dict.fromkeys((r["model"], r["share"]) for r in rows):
        part = [r for r in rows if r["model"] == model and r["share"] == share]
        static = next(r for r in part if r["variant"] == "static")
        out.append(
            f"\n**{model}, kept share {share}** (load {part[0]['load']:.2f}, {part[0]['threads']} thread(s))\n\n"
            "| variant | avg heads | dev acc % | vs static (pts) | b1 ms | b1 / static | b16 ms | b16 / static |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|"
        )
        for r in part:
            b1 = f"{r['ms_b1']:.2f} | {r['ms_b1'] / static['ms_b1']:.2f}" if r.get("ms_b1") else "- | -"
            b16 = f"{r['ms_b16']:.2f} | {r['ms_b16'] / static['ms_b16']:.2f}" if r.get("ms_b16") else "- | -"
            out.append(
                f"| {r['variant']} | {r['heads']:.1f} | {r['accuracy']:.2f} | "
                f"{r['accuracy'] - static['accuracy']:+.2f} | {b1} | {b16} |"
            )
        routed = next((r for r in part if "extra" in r), None)
        if routed:
            e = routed["extra"]
            out.append(
                f"\nwidths (heads) {e['width_heads']}, routed dev share per width "
                f"{[round(s, 3) for s in e['width_share_dev']]}; gate KD loss per epoch "
                f"{[round(x, 4) for x in e['gate_loss']]}"
            )
    return "\n".join(out)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/dyn"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--shares", type=float, nargs="+", default=[0.5], help="average kept share of heads per input")
    p.add_argument("--heads", type=int, default=12, help="heads per layer of the models (the budget's bound)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=5e-3, help="the gates' Adam learning rate")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--single", type=int, default=96, help="dev inputs timed at batch 1")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    p.add_argument("--json", type=Path)
    p.add_argument("--tables-from", type=Path)
    args = p.parse_args(argv)
    for share in args.shares:  # a budget above the head count is refused before anything is built or written
        try:
            dg.check_budget(share * args.heads, args.heads)
        except ValueError as error:
            print(f"Error: --shares {share}: {error}; give a share in (0, 1]", file=sys.stderr)
            raise SystemExit(2) from None
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.tables_from:
        print(tables(json.loads(args.tables_from.read_text())))
        return
    print(tables(run(args)))


if __name__ == "__main__":
    main()
