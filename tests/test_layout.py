"""The package's shape: the library never imports the command line, JSON-only commands
never import torch, and the public API answers from its documented names."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import headprune_cli
from headprune_cli.stages.score.importance import HEAD_METHODS
from scripts.tools.package_graph import cycles as _cycles
from scripts.tools.package_graph import imports as _imports
from scripts.tools.package_graph import module_graph

PACKAGE = Path(headprune_cli.__file__).parent
ROOT = PACKAGE.parent


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
    typed = tmp_path / "headprune_cli" / "pipeline" / "typed.py"
    typed.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from headprune_cli.stages.profile.stage import X\n"
        "import headprune_cli.files.io\n"
    )
    assert _imports(typed, tmp_path) == {"typing", "typing.TYPE_CHECKING", "headprune_cli.files.io"}


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


def test_every_public_name_resolves():
    """The public table follows the modules it points into: a module moved without its entry fails here."""
    missing = []
    for name in headprune_cli.__all__:
        try:
            getattr(headprune_cli, name)
        except (AttributeError, ImportError) as exc:
            missing.append(f"{name}: {exc}")
    assert missing == []


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


def _package_imports(folder: Path = PACKAGE) -> dict[str, set[str]]:
    return module_graph(folder, ROOT)


def test_the_package_has_no_import_circles():
    # Function-level imports count: a circle hidden inside a function is still a circle.
    assert _cycles(_package_imports()) == []


# The allowed direction between packages, top to bottom: a package imports only packages on a
# lower row. Stage packages (stages/<name>/, and shared ones such as a training loop) share a row:
# between them only library modules, never another stage's entry file stage.py, and no circle.
# A module's package is scripts/tools/package_graph.py's package_of (a stage with its subpackages).
LAYERS = [
    ("headprune_cli",),  # the public API (its __init__) and the entry point
    ("headprune_cli.cli",),
    ("headprune_cli.pipeline",),
    ("headprune_cli.stages.<name>",),
    ("headprune_cli.stages",),  # shared stage modules at stages/ top: unit, budget, objectives, timing, ...
    ("headprune_cli.data", "headprune_cli.artifacts"),
    ("headprune_cli.runtime",),  # the device, torchrun, recomputation, the allocator (data's readers trim the heap)
    ("headprune_cli.model",),
    ("headprune_cli.files",),
    ("headprune_cli.errors", "headprune_cli.names", "headprune_cli.ranges"),
]
STAGE_ROW = 3


def _row(package: str) -> int:
    for number, row in enumerate(LAYERS):
        if package in row:
            return number
    if package.startswith("headprune_cli.stages."):
        return STAGE_ROW
    raise AssertionError(f"{package} has no row in LAYERS: give the new package its place in the direction")


def _packages() -> dict[str, set[str]]:
    from scripts.tools.package_graph import package_graph

    return package_graph(_package_imports())


def test_packages_import_only_downwards():
    upwards = sorted(
        f"{a} -> {b}"
        for a, targets in _packages().items()
        for b in targets
        if not (_row(a) < _row(b) or _row(a) == _row(b) == STAGE_ROW)
    )
    assert upwards == []


def test_packages_import_each_other_in_no_circle():
    # Function-level imports count, as for modules.
    assert _cycles(_packages()) == []


def test_the_package_graph_sees_a_circle_between_stage_packages(tmp_path):
    # What the two tests above rest on: two stage packages importing each other's library
    # modules (one of the imports inside a function) are one circle, and so is a shared stage
    # module that reaches up into a stage package that imports it.
    from scripts.tools.package_graph import package_graph

    stages = tmp_path / "headprune_cli" / "stages"
    files = {
        "score/table.py": "from headprune_cli.stages.select.chains import Selection\n",
        "select/chains.py": "def f():\n    from headprune_cli.stages.score.table import ScoreTable\n",
        "options.py": "from headprune_cli.stages.learn.lora import Spec\n",
        "learn/lora.py": "from headprune_cli.stages.options import LoraOptions\n",
    }
    for name, text in files.items():
        (stages / name).parent.mkdir(parents=True, exist_ok=True)
        (stages / name).write_text(text)
    graph = package_graph(module_graph(tmp_path / "headprune_cli", tmp_path))
    assert _cycles(graph) == [
        ["headprune_cli.stages", "headprune_cli.stages.learn"],
        ["headprune_cli.stages.score", "headprune_cli.stages.select"],
    ]


def test_no_stage_imports_another_stages_entry_file():
    """Code two stages share lives in a module of its own (prune/cut.py, a shared stages/ module),
    never in one stage's stage.py: that file is the stage's options, run and STAGE."""
    from scripts.tools.package_graph import package_of

    found = sorted(
        f"{a} -> {b}"
        for a, targets in _package_imports().items()
        for b in targets
        if b.endswith(".stage")
        and b.startswith("headprune_cli.stages.")
        and package_of(a) != package_of(b)
        and package_of(a).startswith("headprune_cli.stages.")
    )
    assert found == []


def test_the_circle_finder_finds_a_circle_hidden_in_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_private_name_is_imported_from_another_module():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("headprune_cli"):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private:
                    offenders.append(f"{path.relative_to(ROOT)}: {node.module} {private}")
    assert offenders == []


def test_every_stage_is_a_package_found_by_the_registry_rule():
    from headprune_cli.stages import unit

    stages = PACKAGE / "stages"
    packages = sorted(p.parent.name for p in stages.glob("*/stage.py"))
    assert packages == sorted(unit.module_of(name).split(".")[-2] for name in unit.NAMES)
    for name in unit.NAMES:
        assert unit.get(name).name == name
    # What sits at stages/ top besides the packages: the few modules every stage shares.
    assert sorted(p.name for p in stages.glob("*.py")) == [
        "__init__.py",
        "budget.py",
        "constraints.py",
        "lm_chunks.py",
        "model_latency.py",
        "objectives.py",
        "options.py",
        "timing.py",
        "unit.py",
    ]


def test_the_package_root_shows_the_layers():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 8, modules
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert packages == ["artifacts", "cli", "data", "files", "model", "pipeline", "runtime", "stages"]


def test_every_function_level_import_says_why_it_is_not_at_the_top():
    # Imports sit at the top of a module; the few that stay inside a function keep a heavy
    # package (torch, transformers, an optional extra) out of light commands, and say so.
    unexplained = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        for function in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    comment = lines[node.end_lineno - 1].partition("PLC0415")[2]
                    if not comment.strip(" ()"):
                        unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert unexplained == []


BENCHMARKS = ROOT / "scripts" / "benchmarks"


def _headprune_uses(path: Path) -> list[str]:
    """What a benchmark file reaches in headprune_cli other than its public names: imports of
    internal modules, names outside `__all__`, attributes `headprune_cli.X` outside it; for a shell
    script, the Python it embeds."""
    text = path.read_text()
    if path.suffix == ".sh":  # the import statements of the Python it embeds, one a line
        text = "\n".join(re.findall(r"from headprune_cli[\w.]* import [\w, ]*\w|import headprune_cli[\w.]*", text))
    bad = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("headprune_cli"):
            public = node.module == "headprune_cli"
            bad += [f"{node.module}.{a.name}" for a in node.names if not public or a.name not in headprune_cli.__all__]
        elif isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.startswith("headprune_cli.")]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "headprune_cli":
            bad += [] if node.attr in headprune_cli.__all__ else [f"headprune_cli.{node.attr}"]
    return bad


def test_benchmarks_use_only_the_public_api():
    """scripts/benchmarks reach headprune through `headprune_cli`'s public names or the CLI, so the
    library's internal modules can move without breaking a benchmark."""
    offenders = {p.name: _headprune_uses(p) for p in sorted(BENCHMARKS.glob("*.[ps][yh]"))}
    assert {name: bad for name, bad in offenders.items() if bad} == {}


def test_the_public_api_check_sees_internal_imports(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text(
        "import headprune_cli\nfrom headprune_cli import load\nfrom headprune_cli.model.surgery import apply_plan\n"
        "def f():\n    return headprune_cli.secret(), headprune_cli.save\n"
    )
    assert _headprune_uses(script) == ["headprune_cli.model.surgery.apply_plan", "headprune_cli.secret"]
    shell = tmp_path / "bench.sh"
    shell.write_text('X=$(python -c "from headprune_cli.model.cost import count_params; print(1)")\n')
    assert _headprune_uses(shell) == ["headprune_cli.model.cost.count_params"]


def test_the_benchmarks_have_no_import_circles():
    assert _cycles(_package_imports(BENCHMARKS)) == []
