"""Running a prepared pipeline: each stage's `run` called with its options, in order,
reruns skipped by fingerprint.

A stage's fingerprint is the sha256 of its command line and of every input file it
names; `run-state.json` keeps each finished stage's fingerprint and its outputs' sha256.
A stage is skipped when both still match; once one stage runs, every later one runs
too, so a changed option redoes its stage and those after it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from headprune_cli import __version__
from headprune_cli.errors import EXIT_GATE_FAILED, EXIT_OK, Interrupted, report
from headprune_cli.files.io import atomic_write_bytes, sha256_bytes, sha256_file
from headprune_cli.files.outputs import exclusive, make_folder
from headprune_cli.pipeline.prepare import RESOLVED_FILE, STATE_FILE, Pipeline, Stage
from headprune_cli.stages import unit


@dataclass
class StageResult:
    name: str
    command: str
    status: str  # ran | skipped | failed
    code: int
    seconds: float
    outputs: list[str]


Runner = Callable[[Stage], int]
Log = Callable[[str], None]


def run_stage(stage: Stage, context: unit.Context | None = None) -> int:
    """Build the stage's options and call its `run`; its exit code. A refusal or a bug
    ends the stage with its one line on stderr and its exit code, as the command would."""
    declared = unit.get(stage.command)
    try:
        return declared.run(declared.options.model_validate(stage.params), context or unit.Context()).exit_code
    except (Interrupted, KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - as the CLI's mapping: refusals, the environment, bugs
        return report(exc)


def execute(
    pipeline: Pipeline, runner: Runner = run_stage, force: bool = False, log: Log = lambda _: None
) -> list[StageResult]:
    """Run the stages in order; skip unchanged ones; stop at the first failure.

    `runner` runs one stage and returns its exit code (default: the stage's `run`).
    The out folder is locked for the whole run: a second run on it is refused at once."""
    out = make_folder(pipeline.out)
    with exclusive(out, "`headprune run`"):
        return _execute(pipeline, out, runner, force, log)


def _execute(pipeline: Pipeline, out: Path, invoke: Runner, force: bool, log: Log) -> list[StageResult]:
    atomic_write_bytes(out / RESOLVED_FILE, resolved_yaml(pipeline).encode())
    previous = {} if force else _read_state(out)
    state: dict[str, Any] = {"headprune_version": __version__, "stages": []}
    results, dirty = [], force
    for stage in pipeline.stages:
        fingerprint = stage_fingerprint(stage, out)
        before = previous.get(stage.name)
        if not dirty and before is not None and _unchanged(before, fingerprint, out):
            log(f"[{stage.name}] unchanged, skipped")
            state["stages"].append(before)
            results.append(StageResult(stage.name, stage.command, "skipped", before["code"], 0.0, stage.outputs))
            continue
        dirty = True  # a redone stage redoes everything after it
        log(f"[{stage.name}] headprune {' '.join(a if len(a) <= 80 else a[:77] + '...' for a in stage.argv)}")
        start = time.perf_counter()
        code = invoke(stage)
        seconds = time.perf_counter() - start
        ok = code in (EXIT_OK, EXIT_GATE_FAILED) and all(Path(p).exists() for p in stage.outputs)
        results.append(StageResult(stage.name, stage.command, "ran" if ok else "failed", code, seconds, stage.outputs))
        if not ok:
            break
        state["stages"].append(
            {"name": stage.name, "fingerprint": fingerprint, "code": code, "outputs": _hashes(stage.outputs, out)}
        )
    atomic_write_bytes(out / STATE_FILE, (json.dumps(state, indent=2, sort_keys=True) + "\n").encode())
    return results


def exit_code(results: list[StageResult]) -> int:
    """The first failure's code; else 3 when a report gate failed; else 0."""
    for result in results:
        if result.status == "failed":
            return result.code or 1
    return EXIT_GATE_FAILED if any(r.code == EXIT_GATE_FAILED for r in results) else EXIT_OK


def stage_fingerprint(stage: Stage, out: Path | None = None) -> str:
    """sha256 over the command line and the sha256 of every input file it names.

    Paths inside `out` count relative to it, so that the same config run into two out
    folders (or a moved one) gives the same fingerprints and the same run-state.json."""
    outputs = set(stage.outputs)
    inputs = {_portable(a, out): _hash_path(a) for a in stage.argv if a not in outputs and _is_file_arg(a)}
    argv = [_portable(a, out) for a in stage.argv]
    blob = json.dumps({"argv": argv, "inputs": inputs, "version": __version__}, sort_keys=True)
    return sha256_bytes(blob.encode())


def _portable(arg: str, out: Path | None) -> str:
    prefix = f"{out}{os.sep}" if out is not None else None
    return "{out}" + os.sep + arg[len(prefix) :] if prefix and arg.startswith(prefix) else arg


def _is_file_arg(arg: str) -> bool:
    """A file, or a model folder; any other folder an option happens to name (`/usr`)
    is a value, not an input, and is never walked and hashed."""
    if arg.startswith("-") or not os.path.exists(arg):
        return False
    path = Path(arg)
    return path.is_file() or (
        path.is_dir() and any((path / name).is_file() for name in ("config.json", "headprune.json"))
    )


def _hash_path(path: str) -> str:
    p = Path(path)
    if p.is_file():
        return sha256_file(p)
    return sha256_bytes(
        "".join(f"{f.relative_to(p)}:{sha256_file(f)}" for f in sorted(p.rglob("*")) if f.is_file()).encode()
    )


def _hashes(paths: list[str], out: Path) -> dict[str, str]:
    """Each output's sha256, keyed by its name inside `out`."""
    return {os.path.relpath(p, out): _hash_path(p) for p in paths}


def _unchanged(before: dict | None, fingerprint: str, out: Path) -> bool:
    if not before or before.get("fingerprint") != fingerprint:
        return False
    return all((out / p).exists() and _hash_path(str(out / p)) == sha for p, sha in before.get("outputs", {}).items())


def _read_state(out: Path) -> dict[str, dict]:
    try:
        data = json.loads((out / STATE_FILE).read_text())
        return {s["name"]: s for s in data.get("stages", []) if isinstance(s, dict) and "name" in s}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}  # no state, or a broken one: everything runs


def resolved_yaml(pipeline: Pipeline) -> str:
    """The config as it ran: top-level values, and each stage's options and command line."""
    top = pipeline.config.model_dump(exclude={"stages"})
    stages = [
        {"name": s.name, "command": s.command, **s.options, "argv": ["headprune", *s.argv]} for s in pipeline.stages
    ]
    return yaml.safe_dump(
        {**top, "stages": stages}, sort_keys=False, default_flow_style=None, width=float("inf")
    )  # no wrapping: it would depend on path lengths
