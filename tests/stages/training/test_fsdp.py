"""`finetune --fsdp`: FSDP2 over 2 torchrun processes (gloo) equals one process; sharded resume."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from headprune_cli import load, save
from headprune_cli.errors import UsageError
from headprune_cli.model.surgery import apply_plan
from headprune_cli.stages.training import sharding
from tests.support import TINY, assert_refused
from tests.support.training import tensor_set

# Distillation from the unpruned model (the teacher is sharded too). Under torchrun the run
# is also stopped after 2 steps and resumed from its sharded state, which must end exactly
# where the uninterrupted run ended.
_RUN = """
import sys
from pathlib import Path
from safetensors.torch import load_file, save_file
from headprune_cli import load
from headprune_cli.runtime.distributed import setup
from headprune_cli.stages.training.distill import load_teacher
from headprune_cli.stages.training.train import FinetuneConfig, finetune

student, root, data, out, state = sys.argv[1:6]
ctx = setup()

def run(folder, dropout=0.0, **extra):
    model = load(student)
    for module in model.modules():  # LLaMA's attention dropout: random draws the resumed run must repeat
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = dropout
    cfg = FinetuneConfig(steps=4, lr=3e-3, warmup=0, batch_size=8, grad_accum=2, seed=1, kd_weight=0.5,
                         fsdp=ctx.active, state_dir=Path(folder), save_every=1, **extra)
    return finetune(model, load_file(data), cfg, teacher=load_teacher(root, model)).model

def write(model, path):
    if ctx.main:
        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, path)

write(run(state + "/straight"), out)
if ctx.active:
    run(state + "/stopped", stop_after=2)
    write(run(state + "/stopped", resume=True), out + ".resumed")
if ctx.active and sys.argv[6:] == ["dropout"]:  # every rank's random stream is saved and restored too
    write(run(state + "/drop", dropout=0.5), out + ".drop")
    run(state + "/drop-stopped", dropout=0.5, stop_after=2)
    write(run(state + "/drop-stopped", dropout=0.5, resume=True), out + ".drop.resumed")
"""


def _workspace(tmp_path: Path, family: str) -> tuple[Path, Path, Path]:
    save(TINY[family](), tmp_path / "root.safetensors")
    model = load(tmp_path / "root.safetensors")
    apply_plan(model, {0: [0, 1, 2, 3]} if family == "llama-gqa" else {0: [1], 2: [0]}, [])
    save(model, tmp_path / "pruned.safetensors")
    data = tensor_set(tmp_path / "train.safetensors", labels=family == "reference")
    (tmp_path / "run.py").write_text(_RUN)
    return tmp_path / "pruned.safetensors", tmp_path / "root.safetensors", data


def _launch(argv: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HEADPRUNE_DEBUG": "1"}
    done = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("family", ["llama-gqa", "reference"])
def test_fsdp_over_two_processes_equals_one_process_and_resumes_exactly(tmp_path, family):
    student, root, data = _workspace(tmp_path, family)
    args = [str(tmp_path / "run.py"), str(student), str(root), str(data)]
    _launch([sys.executable, *args, str(tmp_path / "one.safetensors"), str(tmp_path / "st1")])
    torchrun = str(Path(sys.executable).parent / "torchrun")
    _launch(
        [
            torchrun,
            "--standalone",
            "--nproc-per-node",
            "2",
            *args,
            str(tmp_path / "two.safetensors"),
            str(tmp_path / "st2"),
            *(["dropout"] if family == "llama-gqa" else []),
        ]
    )
    one, two = load_file(str(tmp_path / "one.safetensors")), load_file(str(tmp_path / "two.safetensors"))
    start = load(student).state_dict()
    assert one.keys() == two.keys()
    assert max(float((one[k] - start[k]).abs().max()) for k in one) > 2e-3  # it trained
    for name in one:  # the same update up to float summation order (Adam amplifies rounding on tiny gradients)
        torch.testing.assert_close(two[name], one[name], rtol=1e-3, atol=1e-4)
    resumed = load_file(str(tmp_path / "two.safetensors.resumed"))
    for name in two:
        torch.testing.assert_close(resumed[name], two[name], rtol=0, atol=0)
    if family == "llama-gqa":  # with dropout the draws differ per step: resuming must restore each rank's RNG
        drop = load_file(str(tmp_path / "two.safetensors.drop"))
        assert any(not torch.equal(drop[k], two[k]) for k in two)  # the dropout drew
        drop_resumed = load_file(str(tmp_path / "two.safetensors.drop.resumed"))
        for name in drop:
            torch.testing.assert_close(drop_resumed[name], drop[name], rtol=0, atol=0)
    # The sharded state names its plan: another world size is refused before anything is read.
    saved = tmp_path / "st2" / "stopped"
    units = sharding.plan(load(student), 2)["units"]
    with pytest.raises(UsageError, match="saved by 2 processes"):
        sharding.read_state(saved, {"world": 3, "units": units})
    with pytest.raises(UsageError, match="shard units"):
        sharding.read_state(saved, {"world": 2, "units": units + 1})
    sharding.read_state(saved, {"world": 2, "units": units})


def test_fsdp_cli_writes_the_gathered_model_once(tmp_path):
    student, _, data = _workspace(tmp_path, "llama-gqa")
    torchrun = str(Path(sys.executable).parent / "torchrun")
    out = tmp_path / "o.safetensors"
    argv = [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "headprune_cli", "finetune", str(student)]
    _launch([*argv, "--data", str(data), "--teacher", "auto", "--steps", "2", "--fsdp", "--lr", "1e-2", "-o", str(out)])
    model = load(out)
    assert model.headprune.layout.heads == load(student).headprune.layout.heads
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["root.safetensors", "pruned.safetensors", "train.safetensors", "run.py", "o.safetensors"]
    )  # the sharded state is removed after success, and no temporaries are left


def test_fsdp_outside_torchrun_is_refused(cli, tmp_path):
    student, _, data = _workspace(tmp_path, "llama-gqa")
    res = cli("finetune", student, "--data", data, "--steps", "1", "--fsdp", "-o", tmp_path / "o.safetensors")
    assert_refused(res, 2, "--fsdp shards over torchrun's processes")
    assert not (tmp_path / "o.safetensors").exists()
