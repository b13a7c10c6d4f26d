"""Peak memory of the LLM routes on a real checkpoint, through the CLI, against the file's size.

Each command runs in a fresh process under /usr/bin/time -v; its "Maximum resident set size"
(KiB) is divided by the checkpoint's size in KiB. Scoring runs at each row count given
(--rows), to show that the peak does not grow with the calibration rows; times are wall and
CPU seconds per row (wall time depends on the machine's load, the peak does not).

    OMP_NUM_THREADS=1 nice -n 10 python -m scripts.benchmarks.llm_memory /work/models/smollm2.safetensors \
        --text /work/corpus/calib.txt --rows 64 256 1024 --finetune --work /tmp/llm_memory
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path


def timed(command: list[str], log: Path) -> dict:
    """Peak RSS (KiB), wall and CPU seconds of one CLI command; its exit status."""
    with log.open("w") as out:
        status = subprocess.call(["/usr/bin/time", "-v", *command], stdout=out, stderr=subprocess.STDOUT)
    text = log.read_text()

    def field(name: str) -> str:
        match = re.search(rf"{re.escape(name)}: (.+)", text)
        return match.group(1).strip() if match else "nan"

    clock = [float(part) for part in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    wall = sum(value * 60**power for power, value in enumerate(reversed(clock)))
    cpu = float(field("User time (seconds)")) + float(field("System time (seconds)"))
    return {"exit": status, "peak_kib": int(field("Maximum resident set size (kbytes)")), "wall_s": wall, "cpu_s": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--text", type=Path, required=True, help="plain text, one example per line")
    parser.add_argument("--rows", type=int, nargs="*", default=[64, 256, 1024])
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--finetune", action="store_true", help="also one LoRA KD step of 8 rows")
    parser.add_argument("--work", type=Path, default=Path("/tmp/llm_memory"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    size_kib = os.path.getsize(args.checkpoint) / 1024
    cli = [sys.executable, "-m", "headprune_cli"]
    results = {}
    for rows in args.rows:
        command = [*cli, "score", str(args.checkpoint), "--data", str(args.text), "--samples", str(rows), "--ffn"]
        command += ["--objective", "causal-lm", "--method", "fisher", "--max-length", str(args.max_length)]
        command += ["-o", str(args.work / f"scores-{rows}.json"), "--force"]
        run = timed(command, args.work / f"score-{rows}.log")
        run.update(wall_s_per_row=run["wall_s"] / rows, cpu_s_per_row=run["cpu_s"] / rows)
        results[f"score --ffn fisher, {rows} rows"] = run
    if args.finetune:
        command = [*cli, "finetune", str(args.checkpoint), "--data", str(args.text), "--lora", "--teacher"]
        command += [str(args.checkpoint), "--steps", "1", "--batch-size", "8", "--max-length", str(args.max_length)]
        out = args.work / "lora.safetensors"
        results["finetune --lora --teacher, 8 rows a step"] = timed(
            [*command, "-o", str(out), "--force"], args.work / "finetune.log"
        )
    for run in results.values():
        run["of_checkpoint"] = round(run["peak_kib"] / size_kib, 3)
    print(json.dumps({"checkpoint_kib": round(size_kib), "runs": results}, indent=1))


if __name__ == "__main__":
    main()
