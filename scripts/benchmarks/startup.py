"""Start-up time of JSON-only commands, side by side with a bare Python start.

    python -m scripts.benchmarks.startup [--repeats 15]

Each command runs in a fresh process; the runs are interleaved (one of each per round)
so that machine load hits every command alike, and medians are printed as a Markdown
table for BENCHMARKS.md. `select` reads a scores file made once before timing.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo"


def _seconds(argv: list[str]) -> tuple[float, float]:
    """Wall seconds, and CPU seconds (user + system) of the child: the latter barely moves
    with machine load, so it shows the import cost even on a busy machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        scores, plan = Path(tmp) / "scores.json", Path(tmp) / "plan.json"
        hp = [sys.executable, "-m", "headprune_cli"]
        subprocess.run(
            hp
            + [
                "score",
                str(DEMO / "model.safetensors"),
                "--method",
                "random",
                "--data",
                str(DEMO / "calib.jsonl"),
                "-o",
                str(scores),
            ],
            check=True,
            capture_output=True,
        )
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "headprune --help": hp + ["--help"],
            "headprune select --ratio 0.5": hp + ["select", str(scores), "--ratio", "0.5", "-o", str(plan), "--force"],
            "python -c 'import torch' (for scale)": [sys.executable, "-c", "import torch"],
        }
        walls = {name: [] for name in commands}
        cpus = {name: [] for name in commands}
        for _ in range(args.repeats):
            for name, argv in commands.items():
                wall, cpu = _seconds(argv)
                walls[name].append(wall)
                cpus[name].append(cpu)
    print(f"load average before/after: {load_before} / {os.getloadavg()}")
    base = statistics.median(walls["python -c pass"])
    print(
        f"| command | wall s, median of {args.repeats} | wall s, min | CPU s, median | "
        "wall minus bare Python start (s) |"
    )
    print("|---|---:|---:|---:|---:|")
    for name in commands:
        median = statistics.median(walls[name])
        print(
            f"| `{name}` | {median:.3f} | {min(walls[name]):.3f} | "
            f"{statistics.median(cpus[name]):.3f} | {median - base:+.3f} |"
        )


if __name__ == "__main__":
    main()
