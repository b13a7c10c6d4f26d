"""`headprune finetune` end to end: output, teacher auto, bad input, torchrun = single process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from headprune_cli import load, save
from tests.support import TINY, VOCAB, assert_refused, snapshot


def _tensor_set(path: Path, rows: int = 32, seed: int = 0, labels_mod: int = 2) -> Path:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (rows, 8), generator=gen)
    save_file({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids[:, 0] % labels_mod}, str(path))
    return path


def test_finetune_writes_a_checkpoint_and_cleans_its_state(cli, pruned):
    folder = pruned.parent
    out = folder / "ft.safetensors"
    res = cli(
        "finetune",
        pruned,
        "--data",
        folder / "train.safetensors",
        "--eval-data",
        folder / "dev.safetensors",
        "--teacher",
        "auto",
        "--epochs",
        "2",
        "--lr",
        "1e-3",
        "-o",
        out,
    )
    assert res.code == 0, res.err
    assert res.out == ""  # stdout carries data only
    assert "accuracy" in res.err and "best" in res.err
    model = load(out)
    assert model.headprune.layout.heads == load(pruned).headprune.layout.heads
    assert not (folder / "ft.safetensors.state").exists()
    assert (
        cli("finetune", pruned, "--data", folder / "train.safetensors", "--steps", "1", "-o", out).code == 2
    )  # exists


def test_bad_input_writes_nothing(cli, pruned, tmp_path):
    import transformers as T

    folder = pruned.parent
    other = T.BertForSequenceClassification(
        T.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48)
    )
    save(other, folder / "bert.safetensors")
    ref = TINY["reference"]()
    ref.config.vocab_size = VOCAB + 4
    ref.token_embedding = torch.nn.Embedding(VOCAB + 4, 32)
    save(ref, folder / "bigvocab.safetensors")
    _tensor_set(folder / "dev-bad.safetensors", labels_mod=5)
    before = snapshot(folder)
    train = folder / "train.safetensors"
    cases = {
        "KD needs the same family": (2, ["--teacher", folder / "bert.safetensors"]),
        "has a different vocabulary": (2, ["--teacher", folder / "bigvocab.safetensors"]),
        "zero training steps": (2, ["--steps", "0"]),
        "out of range for 2 classes": (1, ["--eval-data", folder / "dev-bad.safetensors"]),
        "is a root model itself": (2, ["--teacher", "auto", "--steps", "1"]),
    }
    for message, (code, extra) in cases.items():
        ckpt = folder / "root.safetensors" if message == "is a root model itself" else pruned
        assert_refused(cli("finetune", ckpt, "--data", train, *extra, "-o", folder / "out.safetensors"), code, message)
        assert snapshot(folder) == before


def _torchrun() -> str:
    path = Path(sys.executable).parent / "torchrun"
    assert path.exists(), "torchrun (installed with torch) must sit next to the interpreter"
    return str(path)


def test_torchrun_two_processes_match_one(pruned):
    folder = pruned.parent
    args = [
        "finetune",
        str(pruned),
        "--data",
        str(folder / "train.safetensors"),
        "--steps",
        "4",
        "--batch-size",
        "8",
        "--grad-accum",
        "2",
        "--lr",
        "1e-3",
        "--seed",
        "1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HEADPRUNE_DEBUG": "1"}
    single = subprocess.run(
        [sys.executable, "-m", "headprune_cli", *args, "-o", str(folder / "one.safetensors")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert single.returncode == 0, single.stderr
    launch = [
        _torchrun(),
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "headprune_cli",
        *args,
        "-o",
        str(folder / "two.safetensors"),
    ]
    double = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=300)
    assert double.returncode == 0, double.stderr[-3000:]
    one, two = load_file(str(folder / "one.safetensors")), load_file(str(folder / "two.safetensors"))
    start = load_file(str(pruned))
    assert one.keys() == two.keys()
    moved = max(float((one[k] - start[k]).abs().max()) for k in one)
    assert moved > 2e-3  # training changed the weights...
    for name in one:  # ...identically in both runs, up to float summation order
        torch.testing.assert_close(
            two[name], one[name], rtol=1e-3, atol=1e-4
        )  # Adam amplifies rounding on tiny gradients


_SGD_RUN = """
import sys, torch
from safetensors.torch import load_file, save_file
from headprune_cli import load
from headprune_cli.stages.training import train
# Plain SGD without clipping: an update is exactly lr x the gradient, so a gradient of the
# wrong scale (AdamW normalises it away, clipping caps it) shows in the weights.
train.torch.optim.AdamW = lambda params, lr, weight_decay: torch.optim.SGD(params, lr=lr)
model, data = load(sys.argv[1]), load_file(sys.argv[2])
config = train.FinetuneConfig(steps=3, lr=0.5, warmup=0, max_grad_norm=0, batch_size=8, grad_accum=2, seed=1)
result = train.finetune(model, data, config)
if train.distributed.setup().main:
    save_file({k: v.contiguous() for k, v in result.model.state_dict().items()}, sys.argv[3])
train.distributed.finish()
"""


def test_torchrun_sgd_updates_match_one_process_far_below_the_update_size(pruned):
    """Under the real torchrun, two processes take the same SGD steps as one: the weights
    agree to 1/1000 of how far they moved, so a gradient off by any factor is caught."""
    folder = pruned.parent
    script = folder / "sgd_run.py"
    script.write_text(_SGD_RUN)
    args = [str(script), str(pruned), str(folder / "train.safetensors")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single = subprocess.run(
        [sys.executable, *args, str(folder / "one.safetensors")], env=env, capture_output=True, text=True, timeout=600
    )
    assert single.returncode == 0, single.stderr[-3000:]
    double = subprocess.run(
        [_torchrun(), "--standalone", "--nproc-per-node", "2", *args, str(folder / "two.safetensors")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert double.returncode == 0, double.stderr[-3000:]
    one, two, start = (load_file(str(folder / n)) for n in ("one.safetensors", "two.safetensors", "pruned.safetensors"))
    moved = {k: float((one[k] - start[k]).abs().max()) for k in one}
    assert max(moved.values()) > 1e-2, moved  # the steps moved the weights...
    for name in one:  # ...and both runs moved them the same, far below the size of a move
        diff = float((two[name] - one[name]).abs().max())
        assert diff <= 1e-3 * max(moved.values()) + 1e-7, (name, diff, moved[name])


def test_killed_run_resumes_to_the_same_weights(pruned):
    import json
    import signal
    import time

    folder = pruned.parent
    args = [
        sys.executable,
        "-m",
        "headprune_cli",
        "finetune",
        str(pruned),
        "--data",
        str(folder / "train.safetensors"),
        "--steps",
        "60",
        "--batch-size",
        "4",
        "--lr",
        "1e-3",
        "--save-every",
        "1",
        "--seed",
        "2",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    straight = subprocess.run(
        [*args, "-o", str(folder / "straight.safetensors")], env=env, capture_output=True, text=True, timeout=300
    )
    assert straight.returncode == 0, straight.stderr
    out, state = folder / "resumed.safetensors", folder / "resumed.safetensors.state"
    proc = subprocess.Popen([*args, "-o", str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        latest = state / "latest.json"
        if latest.exists() and json.loads(latest.read_text())["step"] >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()  # a killed run leaves no output, only its training state
    resumed = subprocess.run([*args, "--resume", "-o", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    a, b = load_file(str(folder / "straight.safetensors")), load_file(str(out))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not state.exists()
