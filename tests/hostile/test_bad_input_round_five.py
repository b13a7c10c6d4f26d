"""Bad input on round five's surfaces, part of the bad-input matrix (its contract, workspace and
runner: test_bad_input_matrix.py), then failures that must leave nothing behind.

- torchrun's environment set by hand: WORLD_SIZE without the rendezvous, not a number, a rank
  past the world (finetune and score). A killed rank and a truncated .distcp shard under real
  torchrun processes: tests/runtime/test_faults.py.
- tasks whose file names collide (`b` and `shared-b` both map to plan-shared-b.json; `B` and
  `b` on a case-insensitive disk), also through `headprune run`.
- `finetune --rewind-to` a checkpoint of another architecture of the same family (Qwen3 into
  LLaMA), or with tensors the model has no place for (attention biases).
- `select --runtime llama.cpp|vllm` on models those engines cannot serve.
- `iterate` schedules the constraints cannot meet, refused before the first round.
- resuming a `--lora` training state without --lora, or with another rank.
Each is one `Error:` line, the documented exit code, and every file exactly as it was.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
import transformers as T

from headprune_cli import save
from headprune_cli.cli import main
from tests.hostile import test_bad_input_matrix as matrix
from tests.support import TINY, snapshot
from tests.support.processes import env
from tests.support.training import tensor_set

Case, M, run_case = matrix.Case, matrix.M, matrix.run_case
workspace = matrix.workspace  # the matrix's workspace fixture (module-scoped), used here as it is there
D = "data.jsonl"
LAUNCH = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _task(f: Path, name: str) -> list:
    return ["--task", f"name={name},model={f / M},data={f / D}"]


def _tasks(*names: str) -> Callable[[Path], list]:
    return lambda f: ["tasks", *[a for n in names for a in _task(f, n)], "--target-flops", "0.6", "-o", f / "out"]


def _run_tasks(f: Path) -> None:
    stage = {"command": "tasks", "task": [f"name={n},model={f / M},data={f / D}" for n in ("b", "shared-b")]}
    (f / "run.yaml").write_text(json.dumps({"model": str(f / M), "stages": [{**stage, "target_flops": 0.6}]}))


def _llamas(f: Path) -> None:
    """llama.safetensors and its training rows; qwen3.safetensors of the same shapes; biased.safetensors:
    a LLaMA with attention biases (the same config keys, more tensors)."""
    shape = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2)
    shape |= dict(head_dim=8, intermediate_size=48, max_position_embeddings=128, bos_token_id=0, eos_token_id=0)
    save(T.LlamaForCausalLM(T.LlamaConfig(**shape)), f / "llama.safetensors")
    save(T.Qwen3ForCausalLM(T.Qwen3Config(**shape)), f / "qwen3.safetensors")
    save(T.LlamaForCausalLM(T.LlamaConfig(**shape, attention_bias=True)), f / "biased.safetensors")
    tensor_set(f / "rows.safetensors", labels=False, rows=8)


def _rewind(source: str) -> Callable[[Path], list]:
    return lambda f: [
        *["finetune", f / "llama.safetensors", "--data", f / "rows.safetensors", "--steps", "1"],
        *["--rewind-to", f / source, "-o", f / "o.safetensors"],
    ]


def _gpt2_scores(f: Path) -> None:
    save(TINY["gpt2"](), f / "gpt2.safetensors")
    tensor_set(f / "rows.safetensors", labels=False, rows=8)
    assert (
        main(["score", str(f / "gpt2.safetensors"), "--data", str(f / "rows.safetensors"), "-o", str(f / "g.json")])
        == 0
    )


def _lora_state(f: Path) -> None:
    """o.safetensors.state: a --lora run's training state, kept because its output failed."""
    args = ["finetune", str(f / M), "--data", str(f / D), "--steps", "2", "--save-every", "1", "--lora"]
    with mock.patch("headprune_cli.model.checkpoint.save", side_effect=OSError(28, "No space left on device")):
        assert main([*args, "-o", str(f / "o.safetensors")]) == 1
    assert (f / "o.safetensors.state" / "latest.json").is_file()


def _resume(*extra: str) -> Callable[[Path], list]:
    return lambda f: [
        *["finetune", f / M, "--data", f / D, "--steps", "2", "--save-every", "1", "--resume", *extra],
        *["-o", f / "o.safetensors"],
    ]


def _iterate(*schedule: str) -> Callable[[Path], list]:
    return lambda f: [
        *["iterate", f / M, "--data", f / D, "--eval-data", f / D, "--recover", "lstsq", *schedule],
        *["-o", f / "o.safetensors"],
    ]


ROUND_FIVE_CASES = [
    Case(
        "iterate --target-flops 0.8,0.3 past the constraints",
        _iterate("--target-flops", "0.8,0.3"),
        2,
        "--target-flops 0.3 (the schedule's last round) cannot be met within the constraints, measured on the "
        "original model (best: 0.500",
    ),
    Case(
        "iterate --schedule 0.5,0.99 past what can be removed",
        _iterate("--schedule", "0.5,0.99"),
        2,
        "--schedule 0.99: at most 12 of the 16 heads",
    ),
    Case("tasks b and shared-b", _tasks("b", "shared-b"), 2, "'b' and 'shared-b' would both write plan-shared-b.json"),
    Case("tasks B and b", _tasks("B", "b"), 2, "would both write scores-B.json"),
    Case(
        "run: tasks b and shared-b", lambda f: ["run", f / "run.yaml", "--out", f / "o"], 2, "plan-shared-b", _run_tasks
    ),
    Case("rewind: Qwen3 into LLaMA", _rewind("qwen3.safetensors"), 2, "is a 'qwen3' model", _llamas),
    Case("rewind: tensors with no place", _rewind("biased.safetensors"), 2, "has no place for", _llamas),
    Case(
        "select --runtime llama.cpp on an encoder",
        lambda f: ["select", f / "scores.json", "--ratio", "0.3", "--runtime", "llama.cpp", "-o", f / "p.json"],
        2,
        "--runtime llama.cpp serves LLaMA-family causal LMs",
    ),
    Case(
        "select --runtime vllm on an encoder",
        lambda f: ["select", f / "scores.json", "--ratio", "0.3", "--runtime", "vllm", "-o", f / "p.json"],
        2,
        "--runtime vllm serves LLaMA-family causal LMs",
    ),
    Case(
        "select --runtime vllm on GPT-2",
        lambda f: ["select", f / "g.json", "--ratio", "0.3", "--runtime", "vllm", "-o", f / "p.json"],
        2,
        "is a gpt2 causal-lm",
        _gpt2_scores,
    ),
    Case("resume a --lora state without --lora", _resume(), 2, "used different settings (lora, lr)", _lora_state),
    Case(
        "resume a --lora state at another rank",
        _resume("--lora", "--lora-rank", "4"),
        2,
        "used different settings (lora)",
        _lora_state,
    ),
]
# torchrun's variables set by hand: (environment, a piece of the one line), for finetune, learn and score.
LAUNCH_CASES = [
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 but RANK, MASTER_ADDR, MASTER_PORT not set"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
    ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}, "RANK=2 is not below"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "x", "MASTER_PORT": "0x"}, "MASTER_PORT='0x'"),
]
LAUNCHED = {
    "finetune": lambda f: ["finetune", f / M, "--data", f / D, "--steps", "1", "-o", f / "o.safetensors"],
    "score": lambda f: ["score", f / M, "--data", f / D, "-o", f / "s.json"],
    # the learned-gate stage trains with the same loop (exit 70 before the loop shared the launch check)
    "learn": lambda f: [
        "learn",
        f / M,
        "--data",
        f / D,
        "--target-flops",
        "0.5",
        "--steps",
        "1",
        "-o",
        f / "o.safetensors",
    ],
}


@pytest.mark.parametrize("case", ROUND_FIVE_CASES, ids=[c.name for c in ROUND_FIVE_CASES])
def test_round_five_refusals(case: Case, workspace: Path, tmp_path: Path, cli):
    run_case(case, workspace, tmp_path, cli)
    assert not (tmp_path / "ws" / "out").exists() and not (tmp_path / "ws" / "o.safetensors").exists()


@pytest.mark.parametrize("command", sorted(LAUNCHED))
@pytest.mark.parametrize("environment,message", LAUNCH_CASES, ids=[m.split(" ")[0] for _, m in LAUNCH_CASES])
def test_a_hand_set_torchrun_environment(command, environment, message, workspace, tmp_path, cli, monkeypatch):
    for name in LAUNCH:
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    run_case(Case(f"{command} {message}", LAUNCHED[command], 2, message), workspace, tmp_path, cli)


# --- a command that fails leaves nothing it created -------------------------------------
def _limited(args: list, cwd: Path, limit: int) -> subprocess.CompletedProcess:
    """`headprune ARGS` where no file may grow past `limit` bytes (RLIMIT_FSIZE: EFBIG)."""
    return subprocess.run(
        [sys.executable, "-m", "headprune_cli", *map(str, args)],
        cwd=cwd,
        env=env(),
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "name,args,limit,message",
    [
        (
            "finetune --lora --keep-adapter, the output too large",
            ["finetune", M, "--data", D, "--steps", "1", "--lora", "--keep-adapter", "adx", "-o", "o.safetensors"],
            300_000,  # the adapter fits, the model (565 KB) does not
            "Error: could not write o.safetensors: File too large\n",
        ),
        (
            "tasks -o, tasks.png too large",
            ["tasks", *["--task", f"name=a,model={M},data={D}", "--task", f"name=b,model={M},data={D}"]]
            + ["--target-flops", "0.6", "-o", "to"],
            20_000,  # the JSON and Markdown files fit, the plot does not
            "Error: could not write to/tasks.png: File too large\n",
        ),
    ],
    ids=["keep-adapter", "tasks"],
)
def test_a_failed_command_leaves_nothing_it_created(name, args, limit, message, workspace: Path, tmp_path: Path):
    folder = tmp_path / "ws"
    folder.mkdir()
    for file in (M, D):
        (folder / file).write_bytes((workspace / file).read_bytes())
    before = snapshot(folder)
    done = _limited(args, folder, limit)
    assert done.returncode == 1 and done.stderr.endswith(message) and done.stderr.count("Error:") == 1, done.stderr
    assert snapshot(folder) == before
    assert sorted(os.listdir(folder)) == [D, M]  # no adapter folder, no task folder, no temporary
