"""What each hostile input of tests/support/hostile_files.py costs: exit code, peak memory
and wall time of the `headprune` process that receives it, for one or more source trees
side by side.

    python -m scripts.benchmarks.hostile                          # this tree
    python -m scripts.benchmarks.hostile --tree /path/to/main     # and another checkout, same run
    python -m scripts.benchmarks.hostile --limit-gb 6             # address-space cap per process

Each bomb runs in a fresh process under RLIMIT_AS (default 4 GiB, so a bomb that is not
refused ends in MemoryError or an abort instead of taking the machine). Peak memory is
the child's ru_maxrss.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.hostile_files import BOMBS

ROOT = Path(__file__).resolve().parents[2]


def run_one(tree: Path, args: list, limit: int) -> dict:
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**os.environ, "PYTHONPATH": str(tree)}
    probe = (
        "import resource, subprocess, sys, time;"
        "t = time.perf_counter();"
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True);"
        "print(r.returncode, round(time.perf_counter() - t, 1), "
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024);"
        "print((r.stderr.strip().splitlines() or [''])[-1][:150])"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, sys.executable, "-m", "headprune_cli", *map(str, args)],
        env=env,
        cwd=tree,
        preexec_fn=limited,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    first, _, last = out.stdout.partition("\n")
    code, seconds, rss = first.split()
    return {"code": int(code), "seconds": float(seconds), "peak_mb": int(rss), "stderr": last.strip()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], help="Another source tree to measure beside this one.")
    parser.add_argument("--limit-gb", type=float, default=4.0)
    parser.add_argument("--only", action="append", default=[], help="Run only these bombs.")
    opts = parser.parse_args(argv)
    trees = [ROOT, *map(Path, opts.tree)]
    print("| bomb | tree | exit | peak RSS MB | seconds | last stderr line |\n|---|---|---|---|---|---|")
    for name, make in BOMBS.items():
        if opts.only and name not in opts.only:
            continue
        with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
            folder = Path(tmp)
            shutil.copy(ROOT / "examples" / "demo" / "model.safetensors", folder / "model.safetensors")
            rows = (ROOT / "examples" / "demo" / "dev.jsonl").read_text().splitlines()[:8]
            (folder / "data.jsonl").write_text("\n".join(rows) + "\n")
            args = make(folder)
            for tree in trees:
                r = run_one(tree, args, int(opts.limit_gb * (1 << 30)))
                print(
                    f"| {name} | {tree.name} | {r['code']} | {r['peak_mb']} | {r['seconds']} | "
                    f"{r['stderr'].replace('|', '/')} |",
                    flush=True,
                )
                for extra in folder.glob("long-scores.json"):
                    extra.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
