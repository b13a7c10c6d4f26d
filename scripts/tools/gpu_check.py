"""The accelerator paths, checked on a machine with a CUDA GPU (CI has none: run by hand).

    python scripts/tools/gpu_check.py [--work DIR] [--steps 40]

Makes a small trained LLaMA with grouped-query attention (scripts/tools/make_causal_lm.py),
then runs the commands that take --device on `cuda` and on `cpu` and compares them:

- score (taylor): the same head ranking, scores within 1e-3 relative (float32 both);
- score --dtype bfloat16 on cuda: the ranking still close to float32's (Spearman >= 0.9);
- prune --compensate lstsq: compensated weights within 1e-3, the same dtype on disk;
- finetune --device cuda: trains, and writes the stored dtype;
- report --device cuda: measures prefill and decode (timers wait for the GPU).

Prints one line per check and exits 1 if any fails. Each command runs as a user would
run it: `python -m headprune_cli ...` in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEXT = ROOT / "examples" / "minilm_text.txt"
FAILED: list[str] = []


def headprune(*args) -> float:
    """Run one command; its wall time in seconds (a failure is fatal: later checks need it)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "headprune_cli", *map(str, args)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"FAILED: headprune {' '.join(map(str, args))}\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


def check(name: str, ok: bool, detail: str) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        FAILED.append(name)


def head_scores(path: Path) -> list[float]:
    heads = json.loads(path.read_text())["heads"]  # {layer: {head: score}}
    return [heads[layer][head] for layer in sorted(heads, key=int) for head in sorted(heads[layer], key=int)]


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(values):
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        for rank, i in enumerate(order):
            out[i] = float(rank)
        return out

    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="folder for the files (default: a temporary one)")
    parser.add_argument("--steps", type=int, default=40, help="training steps of the small LLaMA")
    parser.add_argument("--device", default="cuda", help="the device under test (cpu: a dry run of this script)")
    args = parser.parse_args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("no CUDA device: this script checks the GPU paths")
    gpu_name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    work = args.work or Path(tempfile.mkdtemp(prefix="headprune-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, {gpu_name}, device under test {args.device}, work folder {work}", flush=True)
    model = work / "llama.safetensors"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "tools" / "make_causal_lm.py"),
            "--out",
            str(model),
            "--steps",
            str(args.steps),
        ],
        check=True,
    )
    common = ["--method", "taylor", "--data", TEXT, "--samples", "64"]
    seconds = {}
    for name, device in (("cpu", "cpu"), ("cuda", args.device)):
        seconds[name] = headprune("score", model, *common, "--device", device, "-o", work / f"scores-{name}.json")
    cpu, gpu = head_scores(work / "scores-cpu.json"), head_scores(work / "scores-cuda.json")
    worst = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(cpu, gpu))
    check(
        f"score float32, {args.device} vs cpu",
        worst <= 1e-3 and spearman(cpu, gpu) > 0.999,
        f"max relative difference {worst:.2e}, Spearman {spearman(cpu, gpu):.4f}; "
        f"{seconds['cpu']:.1f} s cpu, {seconds['cuda']:.1f} s cuda",
    )
    headprune("score", model, *common, "--device", args.device, "--dtype", "bfloat16", "-o", work / "scores-bf16.json")
    rho = spearman(cpu, head_scores(work / "scores-bf16.json"))
    check(f"score bfloat16 on {args.device} vs float32", rho >= 0.9, f"Spearman {rho:.4f}")

    headprune("select", work / "scores-cuda.json", "--ratio", "0.5", "-o", work / "plan.json")
    from safetensors.torch import load_file

    for name, device in (("cpu", "cpu"), ("cuda", args.device)):
        headprune(
            "prune",
            model,
            "--plan",
            work / "plan.json",
            "--compensate",
            "lstsq",
            "--data",
            TEXT,
            "--device",
            device,
            "-o",
            work / f"pruned-{name}.safetensors",
        )
    a, b = load_file(work / "pruned-cpu.safetensors"), load_file(work / "pruned-cuda.safetensors")
    diff = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    dtypes = {str(t.dtype) for t in b.values()} == {str(t.dtype) for t in load_file(model).values()}
    check(
        f"prune --compensate lstsq, {args.device} vs cpu",
        set(a) == set(b) and diff <= 1e-3 and dtypes,
        f"max |difference| {diff:.2e}, stored dtypes kept: {dtypes}",
    )

    took = headprune(
        "finetune",
        work / "pruned-cuda.safetensors",
        "--data",
        TEXT,
        "--steps",
        "20",
        "--device",
        args.device,
        "-o",
        work / "tuned.safetensors",
    )
    tuned = load_file(work / "tuned.safetensors")
    changed = any(not torch.equal(tuned[k], b[k]) for k in b)
    check(
        f"finetune --device {args.device}",
        changed and {t.dtype for t in tuned.values()} == {t.dtype for t in b.values()},
        f"20 steps in {took:.1f} s, weights changed: {changed}",
    )

    headprune(
        "report",
        "--model",
        work / "tuned.safetensors",
        "--data",
        TEXT,
        "--device",
        args.device,
        "--repeats",
        "5",
        "--decode-prompt",
        "64",
        "--decode-tokens",
        "32",
        "--decode-batch",
        "8",
        "--json",
        work / "report.json",
    )
    report = json.loads((work / "report.json").read_text())
    decode = report["measured"]["decode"]
    check(
        f"report --device {args.device} (prefill, decode)",
        decode is not None and decode["decode_speedup"] > 0,
        f"forward speedup {report['measured']['speedup']:.2f}x, prefill {decode['prefill_speedup']:.2f}x, "
        f"decode {decode['decode_speedup']:.2f}x (predicted "
        f"{report['cost']['decode']['predicted_decode_speedup']:.2f}x)",
    )
    print("all GPU checks passed" if not FAILED else f"failed: {', '.join(FAILED)}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
