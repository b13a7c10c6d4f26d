"""Which latency grid predicts better: the same pruned models priced by several `profile`
tables of one baseline, beside the speedups their reports measured (BENCHMARKS section 16).

Every `report-*.json` under the given folders (latency_budget.py's artifacts: each times
its pruned model interleaved with the baseline) names a pruned checkpoint; its measured
speedup is compared with each table's predicted speedup and with the FLOPs prediction.
Nothing is timed here, so the tables' grids are compared on identical measurements.

  python -m scripts.benchmarks.latency_grid \\
      --tables 5=/tmp/latency_budget/minilm/latency.json 9=/tmp/latency_budget9/minilm/latency.json \\
      --reports /tmp/latency_budget/minilm /tmp/latency_budget9/minilm
  python -m scripts.benchmarks.latency_grid --tables 5=a.json 9=b.json --reports /tmp/latency_budget/debian0 \
      --baseline ~/.cache/headprune/debian-sections/model.safetensors
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def predicted_speedup(table, baseline_counts, model_path: Path) -> float:
    from headprune_cli.model.checkpoint import load
    from headprune_cli.stages.profile.build import layout_counts

    heads, widths = layout_counts(load(model_path))
    return table.predict_ms(*baseline_counts) / table.predict_ms(heads, widths)


def main() -> None:
    from headprune_cli.artifacts.schema import read_artifact
    from headprune_cli.model.latency_table import LatencyTable

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", nargs="+", required=True, help="NAME=latency.json")
    parser.add_argument("--reports", nargs="+", type=Path, required=True, help="folders of report-*.json")
    parser.add_argument(
        "--baseline", type=Path, help="the profiled model (default: model.safetensors in the first folder)"
    )
    args = parser.parse_args()
    tables = {}
    for spec in args.tables:
        name, path = spec.split("=", 1)
        artifact, _ = read_artifact(Path(path), ("latency",))
        tables[name] = LatencyTable.from_artifact(artifact)
    errors = {name: [] for name in [*tables, "flops"]}
    print("| model | measured | " + " | ".join(f"table {n}" for n in tables) + " | FLOPs |")
    print("|---|---:|" + "---:|" * (len(tables) + 1))
    baseline_counts = None
    for folder in args.reports:
        for report_path in sorted(folder.glob("report-*.json")):
            report = json.loads(report_path.read_text())
            measured = (report.get("measured") or {}).get("speedup")
            if not measured:
                continue
            pruned = folder / report_path.name.replace("report-", "pruned-").replace(".json", ".safetensors")
            if baseline_counts is None:
                from headprune_cli.model.checkpoint import load
                from headprune_cli.stages.profile.build import layout_counts

                baseline_counts = layout_counts(load(args.baseline or folder / "model.safetensors"))
            row = {name: predicted_speedup(table, baseline_counts, pruned) for name, table in tables.items()}
            row["flops"] = report["cost"]["predicted_speedup"]
            for name, value in row.items():
                errors[name].append(value / measured - 1)
            print(
                f"| {folder.name}/{pruned.stem} | {measured:.3f}x | "
                + " | ".join(f"{row[n]:.3f}x" for n in [*tables, "flops"])
                + " |"
            )
    for name, errs in errors.items():
        print(
            f"{name}: {len(errs)} models, predicted/measured - 1: mean {statistics.mean(errs):+.3f}, "
            f"mean |.| {statistics.mean(abs(e) for e in errs):.3f}, worst {max(errs, key=abs):+.3f}"
        )


if __name__ == "__main__":
    main()
