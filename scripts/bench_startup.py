"""Start-up time of JSON-only commands, side by side with a bare Python start.

    python scripts/bench_startup.py [--repeats 15]

Each command runs in a fresh process; the runs are interleaved (one of each per round)
so that machine load hits every command alike, and medians are printed as a Markdown
table for BENCHMARKS.md. `select` reads a scores file made once before timing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "demo"


def _seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scores, plan = Path(tmp) / "scores.json", Path(tmp) / "plan.json"
        hp = [sys.executable, "-m", "headprune_cli"]
        subprocess.run(hp + ["score", str(DEMO / "model.safetensors"), "--method", "random", "--data",
                             str(DEMO / "calib.jsonl"), "-o", str(scores)], check=True, capture_output=True)
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "headprune --help": hp + ["--help"],
            "headprune select --ratio 0.5": hp + ["select", str(scores), "--ratio", "0.5", "-o", str(plan), "--force"],
            "python -c 'import torch' (for scale)": [sys.executable, "-c", "import torch"],
        }
        times = {name: [] for name in commands}
        for _ in range(args.repeats):
            for name, argv in commands.items():
                times[name].append(_seconds(argv))
    base = statistics.median(times["python -c pass"])
    print(f"| command | median s (of {args.repeats}) | min s | minus bare Python start (s) |")
    print("|---|---:|---:|---:|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| `{name}` | {median:.3f} | {min(values):.3f} | {median - base:+.3f} |")


if __name__ == "__main__":
    main()
