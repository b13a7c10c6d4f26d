"""The package's shape: the library never imports the command line, JSON-only commands
never import torch, and the public API answers from its documented names."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import headprune_cli
from headprune_cli.stages.score.importance import HEAD_METHODS

PACKAGE = Path(headprune_cli.__file__).parent
ROOT = PACKAGE.parent


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every module a file imports, function-level imports included, as absolute names."""
    here = _module_name(path, root).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def test_no_module_outside_cli_imports_the_cli():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "cli") or path.name == "__main__.py":
            continue  # __main__ is the entry point: it runs the CLI
        bad = sorted(m for m in _imports(path) if m == "headprune_cli.cli" or m.startswith("headprune_cli.cli."))
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}


def test_no_module_outside_cli_imports_typer_or_click():
    """The stages and the pipeline take options models; only cli/ knows about command lines."""
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "cli"):
            continue
        bad = sorted(m for m in _imports(path) if m.split(".")[0] in ("typer", "click"))
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}


def test_the_import_walk_sees_function_level_and_relative_imports(tmp_path):
    # The check above is only as good as this walk: it must see the imports a circle hides in.
    probe = tmp_path / "headprune_cli" / "pipeline" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("def f():\n    from headprune_cli.cli.app import main\n    from ..cli import common\n")
    assert {"headprune_cli.cli.app", "headprune_cli.cli.common"} <= _imports(probe, tmp_path)


def _heavy_modules_after(code: str) -> list[str]:
    probe = (
        code + "\nimport sys, json\nprint(json.dumps(sorted(m for m in ('torch', 'transformers', "
        "'tokenizers') if m in sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_help_and_select_do_not_import_torch(tmp_path):
    scores = tmp_path / "scores.json"
    # A real scores artifact from the bundled demo would need torch to make; select only reads JSON.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "headprune_cli",
            "score",
            str(ROOT / "examples/demo/model.safetensors"),
            "--method",
            "random",
            "--data",
            str(ROOT / "examples/demo/calib.jsonl"),
            "--samples",
            "8",
            "-o",
            str(scores),
        ],
        check=True,
        capture_output=True,
    )
    assert _heavy_modules_after("from headprune_cli.cli.app import main\nmain(['--help'])") == []
    select = (
        f"from headprune_cli.cli.app import main\nmain(['select', {str(scores)!r}, '--ratio', '0.5', '-o', "
        f"{str(tmp_path / 'plan.json')!r}])"
    )
    assert _heavy_modules_after(select) == []
    assert json.loads((tmp_path / "plan.json").read_text())["kind"] == "plan"
    assert _heavy_modules_after("import headprune_cli") == []


def test_the_public_api_resolves_every_documented_name():
    from headprune_cli.model.checkpoint import load, save
    from headprune_cli.model.surgery import apply_plan

    assert headprune_cli.load is load and headprune_cli.save is save and headprune_cli.apply_plan is apply_plan
    from headprune_cli import compensation, export, finetune, importance, iterative, report, selection, sweep

    assert callable(importance.score_model) and callable(selection.select) and callable(compensation.compensate)
    assert callable(finetune.finetune) and callable(iterative.iterative_prune) and callable(report.build_report)
    assert callable(sweep.run_sweep) and callable(export.export_onnx) and callable(export.export_hf)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        headprune_cli.nonsense  # noqa: B018


def test_help_lists_every_command_with_its_docstring_line(cli):
    from headprune_cli.cli.app import COMMANDS, all_commands

    result = cli("--help")
    assert result.code == 0
    for name, command in all_commands().items():
        assert name in result.out and command.help.splitlines()[0][:30] in result.out
    assert list(all_commands()) == list(COMMANDS)


def test_score_help_names_every_registered_method(cli):
    result = cli("score", "--help")
    for method in HEAD_METHODS:
        assert method in result.out
