"""Pruning x quantization: the measured speedup against the unpruned fp32 PyTorch model, and
the quality kept, for the cut alone, int8 alone, and both, side by side in one run.

Variants (each evaluated on the same held-out data, timed interleaved in one loop):
  fp32 PyTorch            the unpruned checkpoint: the reference of every ratio
  cut, PyTorch            the pruned checkpoint in PyTorch
  onnxruntime fp32        the unpruned model exported to ONNX (what the engine alone buys)
  cut, onnxruntime fp32   the pruned model exported to ONNX
  int8                    the unpruned model, `export --onnx --quantize int8-dynamic`
  cut + int8              the pruned model, `export --onnx --quantize int8-dynamic`
  (+ int8-static and cut + int8-static with --calib: `--quantize int8-static --calib-data`)
Quality is the task's main metric through headprune's own evaluation (objectives.evaluate;
onnxruntime models through report.shipped.OnnxModel, the code `report --onnx` runs):
accuracy for classifiers, fidelity (mean cosine to the unpruned model) for embedding models.
Speed: median ms per forward of random token ids at batch 1 and at a serving batch, the
sequence length fixed, every variant on the same thread count (torch.set_num_threads and
onnxruntime's intra-op pool), interleaved in alternating order (report.latency.measure).

The cut is made by the real commands when --pruned is not given: `score --method fisher
--ffn`, `select --target-flops F`, `prune --compensate lstsq` (BENCHMARKS.md, "How deep" route),
optionally `finetune --epochs 1 --teacher auto` (--recovery TRAIN). Files are reused
from --work when present.

Usage (from the repository root; numbers in BENCHMARKS.md):
  OMP_NUM_THREADS=1 nice -n 10 python -m scripts.benchmarks.prune_quantize --work /tmp/pq/minilm \\
      --baseline out/minilm/model.safetensors --pruned out/minilm/prune.safetensors \\
      --eval examples/minilm_heldout.txt --calib examples/minilm_calib.txt --seq-len 128 --batch 16 --json minilm.json
  OMP_NUM_THREADS=1 nice -n 10 python -m scripts.benchmarks.prune_quantize --work /tmp/pq/debian0 \\
      --baseline ~/.cache/headprune/debian-sections/model.safetensors --calib .../calib.jsonl --eval .../dev.jsonl \\
      --target-flops 0.5 --seq-len 32 --batch 8 --json debian0.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _run(*args) -> None:
    """One headprune command, as a user runs it."""
    command = [sys.executable, "-m", "headprune_cli", *[str(a) for a in args]]
    print("+ headprune " + " ".join(str(a) for a in args), file=sys.stderr, flush=True)
    subprocess.run(command, check=True)


def make_cut(work: Path, baseline: Path, calib: Path, flops: float, seq_len: int, train: Path | None) -> Path:
    """fisher heads+FFN scores -> select --target-flops -> prune --compensate lstsq (-> one recovery epoch)."""
    scores, plan, cut = work / "scores.json", work / "plan.json", work / "cut.safetensors"
    if not scores.exists():
        _run("score", baseline, "--data", calib, "--max-length", seq_len, "--method", "fisher", "--ffn", "-o", scores)
    if not plan.exists():
        _run("select", scores, "--target-flops", flops, "-o", plan)
    if not cut.exists():
        _run("prune", "--plan", plan, "--compensate", "lstsq", "--data", calib, "--max-length", seq_len, "-o", cut)
    if train is None:
        return cut
    recovered = work / "cut-ft.safetensors"
    if not recovered.exists():
        _run(
            "finetune",
            cut,
            "--data",
            train,
            "--epochs",
            1,
            "--teacher",
            "auto",
            "--max-length",
            seq_len,
            "-o",
            recovered,
        )
    return recovered


def exports(work: Path, models: dict, calib: Path | None, seq_len: int) -> dict[str, Path]:
    """The ONNX files of every variant (fp32, int8-dynamic, int8-static with --calib)."""
    from headprune_cli import export_onnx, export_quantized, read_data

    files = {}
    for side, model in models.items():
        kinds = ["fp32", "int8-dynamic"] + (["int8-static"] if calib else [])
        for kind in kinds:
            path = work / f"{side}-{kind}.onnx"
            if not path.exists():
                start = time.perf_counter()
                if kind == "fp32":
                    export_onnx(model, path, seq_len=16)
                else:
                    data = (
                        read_data(calib, model, max_length=seq_len, samples=128, need_labels=False) if calib else None
                    )
                    export_quantized(model, path, kind, calibration=data if kind == "int8-static" else None)
                print(f"exported {path.name} in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
            files[side, kind] = path
    return files


def variants(baseline, cut, files: dict, threads: int) -> dict:
    from headprune_cli import OnnxModel

    out = {"fp32 PyTorch": (baseline, baseline), "cut, PyTorch": (cut, cut)}
    for (side, kind), path in files.items():
        checkpoint = baseline if side == "base" else cut
        out[_label(side, kind)] = (OnnxModel(path, checkpoint, threads), checkpoint)
    return out


def _label(side: str, kind: str) -> str:
    name = {"fp32": "onnxruntime fp32", "int8-dynamic": "int8", "int8-static": "int8-static"}[kind]
    if side == "base":
        return name
    return "cut, onnxruntime fp32" if kind == "fp32" else f"cut + {name}"


def quality(models: dict, baseline, data: Path, seq_len: int, batch: int) -> dict[str, float]:
    from headprune_cli import objectives, read_data

    dataset = read_data(data, baseline, max_length=seq_len)
    objective = objectives.default_objective(baseline)
    main = {"classification": "accuracy", "fidelity": "fidelity"}[objective]
    result = {}
    for name, (model, _) in models.items():
        metrics = objectives.evaluate(model, dataset, objective, reference=baseline, batch_size=batch)
        result[name] = next(m.value for m in metrics if m.name == main)
        print(f"{name}: {main} {result[name]:.4f}", file=sys.stderr, flush=True)
    return {"metric": main, "values": result}


def speed(models: dict, batch: int, seq_len: int, threads: int, repeats: int, warmup: int) -> dict:
    from headprune_cli import measure_latency as measure
    from headprune_cli import synthetic_inputs

    inputs = {name: synthetic_inputs(checkpoint, batch, seq_len)[0] for name, (_, checkpoint) in models.items()}
    timed = measure({n: m for n, (m, _) in models.items()}, inputs, repeats, warmup, threads)
    base = timed["fp32 PyTorch"].median_ms
    return {
        name: {"median_ms": lat.median_ms, "q1_ms": lat.q1_ms, "q3_ms": lat.q3_ms, "speedup": base / lat.median_ms}
        for name, lat in timed.items()
    }


def table(result: dict) -> str:
    q = result["quality"]
    points = 100.0
    b1, bn = result["speed"]["batch 1"], result["speed"][f"batch {result['setting']['batch']}"]
    ref = q["values"]["fp32 PyTorch"]
    lines = [
        f"| variant | {q['metric']} | drop (points) | batch 1 ms | speedup "
        f"| batch {result['setting']['batch']} ms | speedup | file MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, value in q["values"].items():
        mb = result["bytes"].get(name)
        lines.append(
            f"| {name} | {value * points:.2f} | {(ref - value) * points:+.2f} | {b1[name]['median_ms']:.1f} | "
            f"{b1[name]['speedup']:.2f}x | {bn[name]['median_ms']:.1f} | {bn[name]['speedup']:.2f}x | "
            f"{'' if mb is None else f'{mb / 1e6:.1f}'} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--pruned", type=Path, help="The cut checkpoint; made by the real commands when absent.")
    parser.add_argument("--eval", type=Path, required=True)
    parser.add_argument("--calib", type=Path, help="Calibration data: for the cut and for int8-static.")
    parser.add_argument("--no-static", action="store_true", help="Leave out the int8-static variants.")
    parser.add_argument("--recovery", type=Path, help="Training data: one recovery epoch after the cut.")
    parser.add_argument("--target-flops", type=float, default=0.5)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8, help="The serving batch (batch 1 is always measured).")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import torch

    from headprune_cli import load

    args.work.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    pruned = args.pruned or make_cut(
        args.work, args.baseline, args.calib, args.target_flops, args.seq_len, args.recovery
    )
    torch.set_num_threads(args.threads)
    baseline, cut = load(args.baseline), load(pruned)
    files = exports(args.work, {"base": baseline, "cut": cut}, None if args.no_static else args.calib, args.seq_len)
    models = variants(baseline, cut, files, args.threads)
    result = {
        "setting": {
            "baseline": str(args.baseline),
            "pruned": str(pruned),
            "eval": str(args.eval),
            "seq_len": args.seq_len,
            "batch": args.batch,
            "threads": args.threads,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "started": started,
            "torch": torch.__version__,
            "onnxruntime": __import__("onnxruntime").__version__,
        },
        "flops_kept": _flops_ratio(baseline, cut, args.seq_len),
        "bytes": _bytes(args, pruned, files),
        "quality": quality(models, baseline, args.eval, args.seq_len, args.batch),
        "speed": {},
    }
    for batch in (1, args.batch):
        result["speed"][f"batch {batch}"] = speed(models, batch, args.seq_len, args.threads, args.repeats, args.warmup)
    result["setting"]["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(table(result))
    print(f"FLOPs kept by the cut: {result['flops_kept']:.3f} (seq {args.seq_len})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _flops_ratio(baseline, cut, seq_len: int) -> float:
    from headprune_cli import flops_per_token

    return flops_per_token(cut, seq_len) / flops_per_token(baseline, seq_len)


def _bytes(args, pruned: Path, files: dict) -> dict[str, int]:
    out = {"fp32 PyTorch": args.baseline.stat().st_size, "cut, PyTorch": pruned.stat().st_size}
    for (side, kind), path in files.items():
        out[_label(side, kind)] = path.stat().st_size
    return out


if __name__ == "__main__":
    sys.exit(main())
