"""Recovery curves on a real LLM: perplexity against tokens trained, LoRA KD and full KD.

Cuts the checkpoint with headprune's default route (`prune --scores S --target-flops T
--data CALIB`, lstsq compensation) at each of --targets, then runs `finetune --teacher auto`
(with `--lora`, and without it for full KD) on the training text for --steps optimizer
steps of --batch-size rows x --max-length tokens. One run per (cut, route): the training
state that `finetune --save-every` writes is copied aside at each step of --points while
the run goes on, and each copy is measured afterwards (LoRA: the adapters merged into the
cut's weights, W + (alpha / r) B A, as `finetune` merges them at the end), so the curve is
one run's trajectory: the points before the last are mid-schedule (the learning rate has
not decayed yet), the last is the run's own output. Perplexity is on the first --eval-rows
rows of the held-out text, which nothing here trains, scores or selects on.

Another cut (an `iterate` output, say) is trained instead when it is put in OUT as
cut-T.safetensors beforehand; --label names it in the rows, so the plot keeps its curve apart.
A cut that was trained before it was cut again (LoRA KD between two rounds) counts those
tokens in with --tokens-before, so its curve starts where they end.

--lrs A,B: the learning-rate trial instead: short runs of --trial-steps at each rate (its
own warmup and decay), judged on --dev rows (not the held-out text).

Rows go to OUT/results.jsonl as they finish; a rerun skips what is there, continues an
interrupted run with `--resume` and keeps the copied states. Peak RSS of each `finetune`
is /usr/bin/time -v's. CLI subprocesses and headprune_cli's public API only.

Usage:
  nice -n 5 python -m scripts.benchmarks.recovery_llm --model /work/models/smollm2.safetensors \
      --scores scores-fisher.json --calib /work/corpus/calib.txt --train /work/corpus/train.txt \
      --heldout /work/corpus/heldout.txt --out runs/recovery-llm --targets 0.8 --routes lora
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model

import headprune_cli as hp
from scripts.benchmarks.recovery_llm_report import plot, render

LORA_A, LORA_B = ".lora_A.default.weight", ".lora_B.default.weight"
PEFT_PREFIX = "base_model.model."


def headprune(*args) -> None:
    """Run one CLI command to its end."""
    done = subprocess.run([sys.executable, "-m", "headprune_cli", *map(str, args)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"headprune {' '.join(map(str, args[:2]))} failed: {done.stderr.strip()[-800:]}")


def perplexity(model, text: Path, rows: int) -> float:
    data = hp.read_data(text, model, max_length=128, samples=rows)
    return next(m.value for m in hp.evaluate(model, data, "causal-lm", batch_size=8) if m.name == "perplexity")


def merge_lora(model, adapters: dict[str, torch.Tensor], scaling: float) -> int:
    """Fold saved LoRA adapters into `model`'s dense weights in place (W += scaling * B @ A);
    the number of projections merged. A saved tensor with no projection to go to is an error.
    The names are the training state's or, in peft's adapter file, without its prefix and
    adapter name."""
    adapters = {_state_name(name): value for name, value in adapters.items()}
    merged = 0
    for name, a in adapters.items():
        if not name.endswith(LORA_A):
            continue
        base = name[: -len(LORA_A)]
        b = adapters[base + LORA_B]
        weight = model.get_submodule(base).weight
        with torch.no_grad():
            weight += (scaling * (b.double() @ a.double())).to(weight.dtype)
        merged += 1
    if merged * 2 != len(adapters):
        raise ValueError(f"{len(adapters)} saved tensors for {merged} adapters: not a LoRA state")
    return merged


def _state_name(name: str) -> str:
    """peft's adapter file name of a tensor -> the training state's (the model's own)."""
    if not name.startswith(PEFT_PREFIX):
        return name
    return name[len(PEFT_PREFIX) :].replace(".lora_A.weight", LORA_A).replace(".lora_B.weight", LORA_B)


def snapshot_model(cut: Path, step_folder: Path, lora_scaling: float | None):
    """The model a saved training state holds: the cut plus the merged adapters (LoRA), or the
    saved weights themselves (full training)."""
    model = hp.load(cut)
    if lora_scaling is not None:
        merge_lora(model, load_file(str(step_folder / "model.safetensors")), lora_scaling)
    else:
        load_model(model, str(step_folder / "model.safetensors"))
    return model.eval()


class Snapshots(threading.Thread):
    """Copies the state folder's step sub-folder aside whenever `finetune` saves one of `steps`
    (each save removes the previous one, so it has to happen while the run goes on)."""

    def __init__(self, state: Path, keep: Path, steps: set[int], stop_at: int | None = None):
        super().__init__(daemon=True)
        self.state, self.keep, self.steps, self.done = state, keep, steps, threading.Event()
        self.stop_at, self.stopped, self.interrupt = stop_at, False, lambda: None
        self.missed: set[int] = set()  # saved and replaced between two looks: steps too fast to copy

    def run(self) -> None:
        while not self.done.is_set():
            self.copy()
            time.sleep(0.1)
        self.copy()

    def copy(self) -> None:
        try:
            step = json.loads((self.state / "latest.json").read_text())["step"]
        except (OSError, ValueError, KeyError):
            return
        target = self.keep / f"step-{step:08d}"
        self.missed |= {s for s in self.steps if s < step and not (self.keep / f"step-{s:08d}").exists()}
        if step in self.steps and not target.exists():
            tmp = self.keep / f".{target.name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            try:
                for name in ("model.safetensors", "state.json"):
                    shutil.copy2(self.state / f"step-{step:08d}" / name, tmp / name)
            except OSError:  # the next save removed it meanwhile: there is no step to keep
                shutil.rmtree(tmp, ignore_errors=True)
                return
            tmp.rename(target)
        if step == self.stop_at and target.exists() and not self.stopped:
            self.stopped = True
            self.interrupt()


def timed_finetune(args: list, log: Path, snapshots: Snapshots) -> float | None:
    """`headprune finetune ARGS` under /usr/bin/time -v while `snapshots` copies its states (and
    interrupts it at its stop step: the CLI then exits 130 with the state kept); peak RSS in GiB."""
    argv = ["/usr/bin/time", "-v", sys.executable, "-m", "headprune_cli", "finetune", *map(str, args)]
    with log.open("w") as out:
        # GNU time ignores SIGINT while it waits, so the group's SIGINT stops only finetune
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        snapshots.interrupt = lambda: os.killpg(proc.pid, signal.SIGINT)
        snapshots.start()
        try:
            code = proc.wait()
        finally:
            snapshots.done.set()
            snapshots.join()
    text = log.read_text()
    if snapshots.missed:
        raise SystemExit(f"the states of steps {sorted(snapshots.missed)} were replaced before they could be copied")
    if code != 0 and not (snapshots.stopped and "Exit status: 130" in text):
        raise SystemExit(f"headprune finetune failed: {text.strip()[-800:]}")
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    return int(peak.group(1)) / 2**20 if peak else None


class Bench:
    def __init__(self, args):
        self.args, self.out = args, Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.results = self.out / "results.jsonl"
        self.pool = ThreadPoolExecutor(max_workers=4)  # the rates of a trial train side by side

    def rows(self) -> list[dict]:
        return [json.loads(line) for line in self.results.read_text().splitlines()] if self.results.exists() else []

    def has(self, **key) -> bool:
        return any(all(r.get(k) == v for k, v in key.items()) for r in self.rows())

    def record(self, row: dict) -> None:
        if self.args.label:
            row = {**row, "label": self.args.label}
        with self.results.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), file=sys.stderr, flush=True)

    def cut(self, target: float) -> Path:
        a, path = self.args, self.out / f"cut-{target}.safetensors"
        if not path.exists():
            calib = ["--data", a.calib, "--samples", a.calib_rows, "--max-length", a.max_length]
            headprune("prune", a.model, "--scores", a.scores, "--target-flops", target, *calib, "-o", path)
        if not self.has(target=target, route="cut", step=0):
            model = hp.load(path)
            flops = hp.flops_per_token(model, a.max_length) / hp.flops_per_token(hp.load(a.model), a.max_length)
            self.row(target, "cut", 0, 0.0, perplexity(model, a.heldout, a.eval_rows), flops_share=flops)
        return path

    @functools.cache  # noqa: B019 (one Bench per run)
    def tokens_per_step(self) -> float:
        """Rows x --max-length, times the share of those positions the training rows fill."""
        a = self.args
        data = hp.read_data(a.train, hp.load(self.cut(a.targets[0])), max_length=a.max_length)
        fill = float(data.attention_mask[:, : a.max_length].float().sum()) / (len(data) * a.max_length)
        return a.batch_size * a.max_length * fill

    def finetune_args(self, cut: Path, route: str, lr: float | None, steps: int) -> list:
        a = self.args
        argv = [cut, "--data", a.train, "--teacher", "auto", "--steps", steps, "--batch-size", a.batch_size]
        argv += ["--max-length", a.max_length, "--seed", a.seed]
        if lr is not None:
            argv += ["--lr", lr]
        if route == "lora":
            argv += ["--lora", "--lora-rank", a.lora_rank, "--lora-alpha", 2 * a.lora_rank]
        return argv + shlex.split(a.finetune_options)

    def adapter_args(self, route: str, name: str) -> list:
        """LoRA: also keep the unmerged adapter, for `check`."""
        return ["--keep-adapter", self.out / f"{name}.adapter"] if route == "lora" else []

    def train(self, cut: Path, name: str, route: str, lr: float | None, points: set[int], stop_at=None) -> tuple:
        """One `finetune` run to --steps, its states at `points` copied aside (stopped after
        `stop_at` when given; a rerun resumes it); (output, copies, peak GiB, seconds)."""
        a = self.args
        output, state, keep = (self.out / f"{name}{suffix}" for suffix in (".safetensors", ".state", ".steps"))
        if output.exists() or (stop_at and (keep / f"step-{stop_at:08d}").exists()):
            return output, keep, None, None
        resume = ["--resume"] if (state / "latest.json").exists() else []
        every = math.gcd(*points, a.steps)
        argv = [*self.finetune_args(cut, route, lr, a.steps), *self.adapter_args(route, name), *resume]
        argv += ["--save-every", every, "--state-dir", state]
        started = time.time()
        watcher = Snapshots(state, keep, points | {a.steps}, stop_at)
        peak = timed_finetune([*argv, "-o", output], self.out / f"{name}.time.log", watcher)
        return output, keep, peak, round(time.time() - started, 1)

    def curve(self, target: float, route: str, lr: float | None) -> None:
        """One run to --steps at `lr`; a row per copied state and one for the output."""
        a, cut = self.args, self.cut(target)
        if self.has(target=target, route=route, step=a.steps):
            return
        output, keep, peak, seconds = self.train(cut, run_name(route, target, lr), route, lr, set(a.points))
        self.measure(target, route, lr)
        per_step, scaling = self.tokens_per_step(), lora_scaling(route)
        final = hp.load(output)
        ppl = perplexity(final, a.heldout, a.eval_rows)
        check = self.check(cut, final, run_name(route, target, lr), scaling)
        self.row(target, route, a.steps, per_step, ppl, lr=lr, peak_rss_gib=peak, train_seconds=seconds, check=check)

    def measure(self, target: float, route: str, lr: float | None) -> None:
        """A row for each copied state of the run at `lr` that has none yet (also while it trains)."""
        a, cut = self.args, self.cut(target)
        keep = self.out / f"{run_name(route, target, lr)}.steps"
        for step in a.points:
            folder = keep / f"step-{step:08d}"
            if folder.is_dir() and not self.has(target=target, route=route, step=step):
                model = snapshot_model(cut, folder, lora_scaling(route))
                ppl = perplexity(model, a.heldout, a.eval_rows)
                self.row(target, route, step, self.tokens_per_step(), ppl, lr=lr)

    def chosen_lr(self, target: float, route: str) -> float | None:
        """The rate the trial picked (lowest dev perplexity), else --lr."""
        trials = [r for r in self.rows() if r["target"] == target and r["route"] == f"{route} lr trial"]
        return min(trials, key=lambda r: r["dev_ppl"])["lr"] if trials else self.args.lr

    def row(self, target: float, route: str, step: int, per_step: float, ppl: float, **extra) -> None:
        base = self.args.unpruned_ppl
        tokens = round(step * per_step + self.args.tokens_before)
        self.record(
            {"target": target, "route": route, "step": step, "tokens": tokens, "ppl": ppl, "x_ppl": ppl / base, **extra}
        )

    def check(self, cut: Path, final, name: str, scaling: float | None) -> float | None:
        """The largest weight difference between finetune's own output and this script's merge of
        the adapter finetune kept (--keep-adapter) into the cut; None for full training."""
        if scaling is None:
            return None
        ours = hp.load(cut)
        merge_lora(ours, load_file(str(self.out / f"{name}.adapter" / "adapter_model.safetensors")), scaling)
        theirs = final.state_dict()
        return max(float((v.float() - theirs[k].float()).abs().max()) for k, v in ours.state_dict().items())

    def lr_trial(self, target: float, route: str) -> float | None:
        """The first --trial-steps of the full run at each of --lrs (the same schedule up to there),
        side by side, judged on the --dev rows (never the held-out text); the best rate, whose
        run `curve` then continues."""
        a, cut = self.args, self.cut(target)
        todo = [lr for lr in a.lrs if not self.has(target=target, route=f"{route} lr trial", lr=lr)]
        runs = {lr: self.pool.submit(self.trial_run, cut, route, target, lr) for lr in todo}
        for lr, run in runs.items():
            keep, peak, seconds = run.result()
            model = snapshot_model(cut, keep / f"step-{a.trial_steps:08d}", lora_scaling(route))
            row = {"target": target, "route": f"{route} lr trial", "lr": lr, "step": a.trial_steps}
            self.record(
                {**row, "dev_ppl": perplexity(model, a.dev, a.eval_rows), "peak_rss_gib": peak, "seconds": seconds}
            )
        return self.chosen_lr(target, route)

    def trial_run(self, cut: Path, route: str, target: float, lr: float) -> tuple:
        steps = self.args.trial_steps
        _, keep, peak, seconds = self.train(cut, run_name(route, target, lr), route, lr, {steps}, stop_at=steps)
        return keep, peak, seconds


def run_name(route: str, target: float, lr: float | None) -> str:
    return f"{route}-{target}-lr{'default' if lr is None else f'{lr:g}'}"


def lora_scaling(route: str) -> float | None:
    """alpha / r of the adapters `finetune_args` asks for (alpha = 2 r); None: full training."""
    return 2.0 if route == "lora" else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("model", "scores", "calib", "train", "heldout", "out"):
        parser.add_argument(f"--{name}", type=Path, required=True)
    parser.add_argument("--dev", type=Path, help="--lrs: rows the rates are judged on (not the held-out text)")
    parser.add_argument("--targets", type=float, nargs="+", default=[0.8, 0.5])
    parser.add_argument("--routes", nargs="+", choices=["lora", "full"], default=["lora"])
    parser.add_argument("--steps", type=int, default=192, help="optimizer steps of each run")
    parser.add_argument("--points", type=int, nargs="+", default=[24, 48, 96], help="steps measured on the way")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--lr", type=float, help="peak rate (default: finetune's own)")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument(
        "--finetune-options", default="", help="more `finetune` options for every run, one string ('--kd-weight 1')"
    )
    parser.add_argument(
        "--label", help="names the cut in every row (a cut put in OUT as cut-T.safetensors beforehand, not the default)"
    )
    parser.add_argument(
        "--tokens-before",
        type=float,
        default=0.0,
        help="tokens the cut in OUT was already trained on (recovered between rounds), counted into every row",
    )
    parser.add_argument("--lrs", type=float, nargs="+", help="pick the rate among these first (--dev)")
    parser.add_argument("--trial-steps", type=int, default=24, help="--lrs: steps each rate runs before the choice")
    parser.add_argument("--calib-rows", type=int, default=16)
    parser.add_argument("--eval-rows", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--unpruned-ppl", type=float, required=True, help="the unpruned model on the same rows")
    parser.add_argument("--plot", type=Path, help="also draw the curves here (PNG)")
    parser.add_argument("--project-to", type=float, default=2e6, help="tokens the curves are extrapolated to")
    parser.add_argument("--measure", action="store_true", help="only measure the states copied so far")
    parser.add_argument("--render", action="store_true", help="only write OUT/table.md (and --plot) from the rows")
    args = parser.parse_args()
    bench = Bench(args)
    if not args.render:
        run(bench, args)
    (bench.out / "table.md").write_text(render(bench.rows(), args.project_to))
    if args.plot:
        plot(bench.rows(), args.plot, args.unpruned_ppl, args.project_to)
    print((bench.out / "table.md").read_text())


def run(bench: Bench, args) -> None:
    for target in args.targets:
        for route in args.routes:
            if args.measure:
                bench.measure(target, route, bench.chosen_lr(target, route))
            else:
                bench.curve(target, route, bench.lr_trial(target, route) if args.lrs else args.lr)


if __name__ == "__main__":
    main()
