"""The package's import graph in numbers: packages, package circles, modules, the largest modules.

    python scripts/tools/package_graph.py [--json]

A module's package is the unit the layering rule speaks of: a stage package with its subpackages
(`stages.score` holds `stages.score.importance`), the shared stage modules at `stages/` top
(`stages`), every other top-level package (`model` holds `model.arch`), the root modules
(`headprune_cli.errors`, each on its own) and the public API (`headprune_cli`, its `__init__`, on top
of everything). Every import counts, function-level ones included: a circle hidden in a
function is still a circle. tests/test_layout.py asserts on the same graph.
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "headprune_cli"
ROOT = PACKAGE.parent


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`: imports for annotations only, never executed.
    A stage's algorithms take its options object (stage.py is the options' one home), so they
    name its type; that is not a dependency of the running code, and not a circle."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every module a file imports, function-level imports included, as absolute names (type-only
    imports under `if TYPE_CHECKING:` left out)."""
    here = module_name(path, root).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    found = set()
    tree = ast.parse(path.read_text())
    skipped = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def module_graph(package: Path = PACKAGE, root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of `package` (a folder under `root`) it imports (function-level imports included)."""
    files = {module_name(path, root): path for path in package.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        targets = set()
        for module in imports(path, root):
            while module and module not in files:  # `from pkg.mod import name` names pkg.mod
                module = module.rpartition(".")[0]
            if module and module != name and not name.startswith(module + "."):
                targets.add(module)  # a module's own package __init__ is not an edge back to it
        graph[name] = targets
    return graph


def package_of(module: str) -> str:
    """The layering unit a module belongs to (see the module docstring)."""
    parts = module.split(".")
    if len(parts) == 1:
        return parts[0]
    if parts[1] == "stages" and len(parts) > 3:
        return ".".join(parts[:3])  # stages.<name>.anything -> stages.<name>
    if parts[1] == "stages" and len(parts) == 3 and (PACKAGE / "stages" / parts[2]).is_dir():
        return ".".join(parts[:3])  # the stage package's own __init__
    if parts[1] == "__main__":
        return parts[0]  # the entry point sits with the public API on top of everything
    return ".".join(parts[:2])  # a top-level package, or a root module (errors, names, ranges) alone


def package_graph(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, targets in modules.items():
        mine = package_of(module)
        graph.setdefault(mine, set()).update(package_of(t) for t in targets if package_of(t) != mine)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def edges_within(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    return sorted(f"{a} -> {b}" for a in component for b in graph[a] if b in component)


def summary(package: Path = PACKAGE) -> dict:
    modules = module_graph(package)
    packages = package_graph(modules)
    circles = cycles(packages)
    lines = {
        m: len((package.parent / (m.replace(".", "/"))).with_suffix(".py").read_text().splitlines())
        for m in modules
        if (package.parent / m.replace(".", "/")).with_suffix(".py").exists()
    }
    return {
        "packages": len(packages),
        "directories": len({str(p.parent) for p in package.rglob("__init__.py")}),
        "modules": len(modules),
        "module_circles": len(cycles(modules)),
        "package_circles": len(circles),
        "circles": [{"packages": c, "edges": edges_within(packages, c)} for c in circles],
        "largest_modules": sorted(lines.items(), key=lambda kv: -kv[1])[:10],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    facts = summary()
    if parser.parse_args().json:
        print(json.dumps(facts, indent=2))
        return
    for key in ("packages", "directories", "modules", "module_circles", "package_circles"):
        print(f"{key}: {facts[key]}")
    for circle in facts["circles"]:
        print("circle:", ", ".join(circle["packages"]))
        for edge in circle["edges"]:
            print("   ", edge)
    print("largest modules:")
    for name, count in facts["largest_modules"]:
        print(f"  {count:5d}  {name}")


if __name__ == "__main__":
    main()
