"""Bad input on the newer surfaces (special-file outputs, latency tables, `run` configs), part of the
bad-input matrix (its contract, workspace and runner: test_bad_input_matrix.py).

- special-file outputs: `--force` never replaces a device node, a FIFO, a socket, or a
  symlink into /dev or /proc (as `/dev/stdout` is), whatever the command. The nodes are made
  in the test's temporary folder (mknod as root; otherwise the device kind is skipped),
  never in the machine's /dev; each must keep its inode, type and device number.
- latency-table cases: over-long curves and maps, curves ending apart, times of 1e308 or
  1e-12 ms, a table over the latency size cap, one at the artifact size cap (peak memory
  measured), an unreadable table. (That no prediction is zero or less:
  tests/model/test_latency_table.py.)
- `headprune run` cases refused before the first stage runs, exit 2.
- others: FFN scores wider than the scored model, a checkpoint that is a FIFO.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from headprune_cli.artifacts.neuron_scores import decode, encode
from headprune_cli.artifacts.schema import MAX_ARTIFACT_BYTES
from headprune_cli.stages.profile.bounds import MAX_POINTS, MAX_TABLE_BYTES
from tests.hostile import test_bad_input_matrix as matrix
from tests.support import ROOT, assert_refused
from tests.support.processes import env

Case, M, run_case, _latency = matrix.Case, matrix.M, matrix.run_case, matrix._latency
workspace = matrix.workspace  # the matrix's workspace fixture (module-scoped), used here as it is there
DATA = "data.jsonl"


# --- special files as outputs ----------------------------------------------------------
def _char_device(path: Path) -> None:
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is


def _socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))  # the socket file stays after the socket is closed


NODES: dict[str, Callable[[Path], None]] = {
    "char device": _char_device,
    "FIFO": os.mkfifo,
    "socket": _socket,
    "link to /dev/null": lambda p: p.symlink_to("/dev/null"),
    "link to /proc/self/fd/1 (as /dev/stdout)": lambda p: p.symlink_to("/proc/self/fd/1"),
}


def _run_yaml(f: Path) -> Path:
    (f / "run.yaml").write_text(
        json.dumps({"model": str(f / M), "data": str(f / DATA), "stages": [{"command": "score"}]})
    )
    return f / "run.yaml"


WRITERS: dict[str, Callable[[Path, Path], list]] = {
    "select -o": lambda f, n: ["select", f / "scores.json", "--ratio", "0.5", "-o", n],
    "profile -o": lambda f, n: ["profile", f / M, "-o", n],
    "export --onnx": lambda f, n: ["export", f / M, "--onnx", n],
    "export --hf": lambda f, n: ["export", f / M, "--hf", n],
    "prune -o": lambda f, n: ["prune", f / M, "--plan", f / "plan.json", "-o", n],
    "score -o": lambda f, n: ["score", f / M, "--data", f / DATA, "-o", n],
    "report --json": lambda f, n: ["report", "--model", f / M, "--baseline", f / M, "--data", f / DATA, "--json", n],
    "report --markdown": lambda f, n: [
        *["report", "--model", f / M, "--baseline", f / M, "--data", f / DATA, "--markdown", n]
    ],
    "search -o": lambda f, n: ["search", f / M, "--data", f / DATA, "--ratio", "0.5", "-o", n],
    "iterate -o": lambda f, n: ["iterate", f / M, "--data", f / DATA, "--eval-data", f / DATA, "-o", n],
    "finetune -o": lambda f, n: ["finetune", f / M, "--data", f / DATA, "--steps", "1", "-o", n],
    "import -o": lambda f, n: ["import", f / M, "-o", n],
    "sweep -o": lambda f, n: ["sweep", f / M, "--data", f / DATA, "--eval-data", f / DATA, "-o", n],
    "run --out": lambda f, n: ["run", _run_yaml(f), "--out", n],
    "report --plot": lambda f, n: ["report", "--model", f / M, "--baseline", f / M, "--data", f / DATA, "--plot", n],
}
SPECIAL = [(node, writer) for node in NODES for writer in WRITERS]


def _identity(path: Path) -> tuple:
    info = os.lstat(path)
    target = os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
    return stat.S_IFMT(info.st_mode), info.st_ino, info.st_rdev, target


@pytest.mark.parametrize("node,writer", SPECIAL, ids=[f"{w} onto a {n}" for n, w in SPECIAL])
def test_force_never_replaces_a_special_file(node: str, writer: str, workspace: Path, tmp_path: Path, cli):
    if node == "char device" and os.geteuid() != 0:
        pytest.skip("mknod of a device needs root")
    folder = tmp_path / "ws"
    folder.mkdir()
    for name in (M, DATA, "scores.json", "plan.json"):
        (folder / name).write_bytes((workspace / name).read_bytes())
    path = folder / "node"
    NODES[node](path)
    args = WRITERS[writer](folder, path)
    before, names = _identity(path), sorted(p.name for p in folder.iterdir())
    result = cli(*args, "--force")
    assert_refused(result, 2, "never replaces")
    assert _identity(path) == before  # the same node: type, inode, device number, link target
    assert sorted(p.name for p in folder.iterdir()) == names  # no temporary, no partial output


# --- latency tables ---------------------------------------------------------------------
def _edit_forward(change: Callable[[dict], None]) -> Callable[[dict], None]:
    return lambda data: change(data["phases"]["forward"])


def _longer_curve(phase: dict) -> None:
    points = phase["layers"]["0"]["attention"]
    phase["layers"]["0"]["attention"] = [dict(points[0], units=1)] * (MAX_POINTS + 1) + points[-1:]


def _ends_apart(phase: dict) -> None:
    """Layer 0's FFN curve ends at half the whole block its attention curve ends at."""
    for point in phase["layers"]["0"]["ffn"]:
        point.update({k: point[k] / 2 for k in ("median_ms", "q1_ms", "q3_ms")})


def _touch(path: Path) -> Path:
    path.touch()
    return path


def _times(value: float) -> Callable[[dict], None]:
    return lambda phase: phase["outside"].update(median_ms=value, q1_ms=value, q3_ms=value)


def _select_by(f: Path, table: str = "edited.json") -> list:
    return ["select", f / "scores.json", "--latency", f / table, "--target-latency", "0.8"]


def _report_by(f: Path) -> list:
    return [
        *["report", "--model", f / M, "--baseline", f / M, "--data", f / DATA, "--repeats", "0"],
        *["--latency", f / "edited.json"],
    ]


LATENCY_CASES = [
    Case(
        "curve longer than profile writes",
        _select_by,
        1,
        "at most 64 points",
        _latency(edit=_edit_forward(_longer_curve)),
    ),
    Case(
        "curves end apart in select",
        _select_by,
        1,
        "both end at the whole block",
        _latency(edit=_edit_forward(_ends_apart)),
    ),
    Case(
        "curves end apart in report",
        _report_by,
        1,
        "both end at the whole block",
        _latency(edit=_edit_forward(_ends_apart)),
    ),
    Case(
        "times of 1e308 ms",
        _select_by,
        1,
        "edited.json: invalid latency: phases.forward.outside: times of 1e+308",
        _latency(edit=_edit_forward(_times(1e308))),
    ),
    Case(
        "times of 1e308 ms in report",
        _report_by,
        1,
        "beyond any measurement",
        _latency(edit=_edit_forward(_times(1e308))),
    ),
    Case("times of 1e-12 ms", _select_by, 1, "beyond any measurement", _latency(edit=_edit_forward(_times(1e-12)))),
    Case(
        "1025 layers",
        _select_by,
        1,
        "at most 1024 layers",
        _latency(edit=lambda d: d["model"].update(num_heads=[4] * 1025)),
    ),
    Case(
        "a phase of 1025 layers",
        _select_by,
        1,
        "phases.forward.layers: 1025 entries",
        _latency(edit=_edit_forward(lambda p: p.update(layers={str(i): p["layers"]["0"] for i in range(1025)}))),
    ),
    Case(
        "table over the latency size cap",
        _select_by,
        1,
        "too large to be a headprune latency artifact",
        lambda f: os.truncate(_touch(f / "edited.json"), MAX_TABLE_BYTES + 1),  # sparse: refused on its size
    ),
]


@pytest.mark.parametrize("case", LATENCY_CASES, ids=[c.name for c in LATENCY_CASES])
def test_latency_table_refused(case: Case, workspace: Path, tmp_path: Path, cli):
    run_case(case, workspace, tmp_path, cli)


def _table_of_size(folder: Path, size: int) -> Path:
    """A latency table of exactly `size` bytes: the real table of the model, with layer 0's
    attention curve grown to fill it (written in chunks: the test never holds it)."""
    _latency()(folder)
    data = json.loads((folder / "t.json").read_text())
    data["phases"]["forward"]["layers"]["0"]["attention"] = "CURVE"
    head, tail = json.dumps(data).split('"CURVE"')
    point = '{"units": 1, "heads": 1, "median_ms": 1.0, "q1_ms": 1.0, "q3_ms": 1.0}'
    count, left = divmod(size - len(head) - len(tail) - len(point) - 2, len(point) + 2)
    path = folder / "big.json"
    with open(path, "w") as handle:
        handle.write(head + "[")
        handle.writelines((point + ", ") * min(100_000, count - done) for done in range(0, count, 100_000))
        handle.write(point + " " * left + "]" + tail)
    assert path.stat().st_size == size
    return path


def test_a_table_at_the_artifact_size_cap_is_refused_within_1_5x_its_size(workspace: Path, tmp_path: Path):
    """The peak resident memory of the whole `headprune select` process tree, read from the
    kernel's accounting (ru_maxrss of the children a wrapper waited for): not timed."""
    folder = tmp_path / "ws"
    folder.mkdir()
    for name in (M, "scores.json"):
        (folder / name).write_bytes((workspace / name).read_bytes())
    table = _table_of_size(folder, MAX_ARTIFACT_BYTES)
    wrapper = (
        "import resource, subprocess, sys\n"
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, done.returncode)\n"
        "sys.stderr.write(done.stderr)\n"
    )
    command = [sys.executable, "-m", "headprune_cli", "select", folder / "scores.json", "--latency", table]
    done = subprocess.run(  # noqa: PLW1510 (the exit code is the assertion)
        [sys.executable, "-c", wrapper, *map(str, command), "--target-latency", "0.8"],
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=300,
    )
    peak, code = map(int, done.stdout.split())
    assert code == 1 and done.stderr.startswith("Error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "too large to be a headprune latency artifact" in done.stderr
    assert peak <= 1.5 * MAX_ARTIFACT_BYTES, (
        f"peak {peak / 2**20:.0f} MiB for a {MAX_ARTIFACT_BYTES / 2**20:.0f} MiB table"
    )


def _without_dac_override() -> None:
    """Run as root without the capabilities that let root read any file: mode 000 then holds."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
            if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                raise OSError(ctypes.get_errno(), "prctl")


def test_an_unreadable_table_says_so_in_one_line(workspace: Path, tmp_path: Path):
    folder = tmp_path / "ws"
    folder.mkdir()
    for name in (M, "scores.json"):
        (folder / name).write_bytes((workspace / name).read_bytes())
    _latency()(folder)
    (folder / "t.json").chmod(0)
    done = subprocess.run(  # noqa: PLW1510 (the exit code is the assertion)
        [sys.executable, "-m", "headprune_cli", *map(str, _select_by(folder, "t.json"))],
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=120,
        preexec_fn=_without_dac_override,
    )
    assert done.returncode == 1 and done.stdout == "", done
    assert done.stderr == f"Error: {folder / 't.json'}: permission denied (not readable by this user)\n"


# --- `headprune run`: every stage's options and files before the first stage ------------
def _config(*stages: dict) -> Callable[[Path], None]:
    def prepare(folder: Path) -> None:
        config = {"model": str(folder / M), "data": str(folder / DATA), "stages": list(stages)}
        (folder / "run.yaml").write_text(json.dumps(config))  # JSON is YAML

    return prepare


SCORE = {"command": "score", "method": "random"}
PROFILE = {"command": "profile", "points": 2, "rounds": 1, "warmup": 0, "min_time": 0.0}


def _run_argv(f: Path) -> list:
    return ["run", f / "run.yaml", "--out", f / "out"]


RUN_CASES = [
    Case(
        "run latency file missing",
        _run_argv,
        2,
        "latency: 'nope.json': no such file",
        _config(SCORE, {"command": "select", "latency": "nope.json", "target_latency": 0.8}),
    ),
    Case(
        "run latency file a FIFO",
        _run_argv,
        2,
        "not a regular file",
        lambda f: (
            os.mkfifo(f / "pipe.json"),
            _config(SCORE, {"command": "select", "latency": str(f / "pipe.json"), "target_latency": 0.8})(f),
        ),
    ),
    Case(
        "run target_latency 1.5",
        _run_argv,
        2,
        "--target-latency 1.5 is outside (0, 1]",
        _config(PROFILE, SCORE, {"command": "select", "target_latency": 1.5}),
    ),
    Case(
        "run target_ms without a table",
        _run_argv,
        2,
        "give --latency TABLE",
        _config(SCORE, {"command": "select", "target_ms": 3}),
    ),
    Case(
        "run search method bogus",
        _run_argv,
        2,
        "unknown method 'bogus'",
        _config(PROFILE, {"command": "search", "method": "bogus", "ratio": 0.5}),
    ),
    Case(
        "run search target_flops 7.5",
        _run_argv,
        2,
        "--target-flops 7.5 is outside (0, 1]",
        _config({"command": "search", "target_flops": 7.5}),
    ),
    Case(
        "run search seconds 0",
        _run_argv,
        2,
        "seconds: Input should be greater than 0 (got 0)",
        _config({"command": "search", "ratio": 0.5, "seconds": 0}),
    ),
    Case(
        "run prune compensate bogus",
        _run_argv,
        2,
        "unknown compensation 'bogus'",
        _config(SCORE, {"command": "prune", "ratio": 0.5, "compensate": "bogus"}),
    ),
    Case(
        "run select scores a FIFO",
        _run_argv,
        2,
        "not a regular file",
        lambda f: (
            os.mkfifo(f / "s.json"),
            _config({"command": "select", "scores": str(f / "s.json"), "ratio": 0.5})(f),
        ),
    ),
    Case(
        "run learn without a target",
        _run_argv,
        2,
        "learn needs a target",
        _config(SCORE, {"command": "learn", "steps": 1}),
    ),
    Case(
        "run finetune learn_gates, the old spelling of learn",
        _run_argv,
        2,
        "(finetune).learn_gates, ratio: moved to the `learn` stage (`command: learn`); remove it",
        _config(SCORE, {"command": "finetune", "learn_gates": True, "ratio": 0.5, "steps": 1}),
    ),
    Case(
        "run report min_speedup without timing",
        _run_argv,
        2,
        "--min-speedup needs latency measurements",
        _config(SCORE, {"command": "report", "min_speedup": 1.1, "repeats": 0}),
    ),
    Case(
        "run sweep ratios not numbers",
        _run_argv,
        2,
        "comma-separated list of float",
        _config({"command": "sweep", "ratios": "half,most"}),
    ),
]


@pytest.mark.parametrize("case", RUN_CASES, ids=[c.name for c in RUN_CASES])
def test_run_refuses_before_any_stage(case: Case, workspace: Path, tmp_path: Path, cli):
    run_case(case, workspace, tmp_path, cli)
    assert not (tmp_path / "ws" / "out").exists()  # nothing ran: not even the out folder


# --- the smaller ones ---------------------------------------------------------------------
def _wider_ffn_scores(folder: Path) -> None:
    """Scores (with FFN blocks) whose layer 0 claims 8 neurons more than the model has."""
    from headprune_cli.cli import main

    assert (
        main(
            [
                "score",
                str(folder / M),
                "--data",
                str(folder / DATA),
                "--method",
                "taylor",
                "--ffn",
                "-o",
                str(folder / "sf.json"),
            ]
        )
        == 0
    )
    data = json.loads((folder / "sf.json").read_text())
    block, width = data["ffn"], data["ffn"]["width"][0]
    values = decode(block["layers"]["0"]["scores"], width)
    block["width"][0] = width + 8
    block["layers"]["0"].update(kept=[[0, width + 8]], scores=encode(values + [-1.0] * 8))
    (folder / "wide.json").write_text(json.dumps(data))
    (folder / "sf.json").unlink()


OTHER_CASES = [
    Case(
        "scores claim a wider FFN than the model",
        lambda f: ["select", f / "wide.json", "--target-flops", "0.5"],
        1,
        "the scored model keeps",
        _wider_ffn_scores,
    ),
    Case(
        "checkpoint a FIFO (score)",
        lambda f: ["score", f / "pipe.safetensors", "--data", f / DATA],
        1,
        "not a regular checkpoint file",
        lambda f: os.mkfifo(f / "pipe.safetensors"),
    ),
    Case(
        "checkpoint a FIFO (inspect)",
        lambda f: ["inspect", f / "pipe.safetensors"],
        1,
        "not a regular checkpoint file",
        lambda f: os.mkfifo(f / "pipe.safetensors"),
    ),
    Case(
        "checkpoint a FIFO (prune)",
        lambda f: ["prune", f / "pipe.safetensors", "--plan", f / "plan.json", "-o", f / "o.safetensors"],
        1,
        "not a regular checkpoint file",
        lambda f: os.mkfifo(f / "pipe.safetensors"),
    ),
]


@pytest.mark.parametrize("case", OTHER_CASES, ids=[c.name for c in OTHER_CASES])
def test_other_refusals(case: Case, workspace: Path, tmp_path: Path, cli):
    run_case(case, workspace, tmp_path, cli)
