"""Every example of README.md and of the docs pages runs as written.

The ```bash and ```python blocks of README.md, then of docs/*.md in the order of `PAGES`,
run in order, each in its own process, in one scratch folder that holds what the repository
ships (examples/, configs/, scripts/), with this tree's `headprune` on PATH: what a new user
gets by pasting them one after another, so a page may use what an earlier one made. A
block right after `<!-- readme-test: skip (why) -->` is not run; skips stay few.
docs/experiments/ holds dated lab notes, whose commands name their own work folders: not run.

`headprune` here is a shim that hands each command to a fork server holding the imported
CLI (tests/support/forkserver.py): some 40 commands each paying the torch import took 7 minutes
on 2 cores, which did not fit the suite's budget. Everything else (argv, folder,
environment, stdin/stdout/stderr, exit codes, pipes) is what the installed script gets.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, ForkServer

README = ROOT / "README.md"
DOCS = ROOT / "docs"
# The docs pages in the order their examples run: commands.md makes the checkpoints that
# serving.md exports. Every page under docs/ is listed (a test checks it).
PAGES = ("commands", "pipeline", "devices", "serving", "reliability", "formats", "methods", "architecture", "testing")
BLOCK = re.compile(
    r"(?:<!-- readme-test: skip \((?P<why>[^)]+)\) -->\n)?```(?P<lang>[a-z]*)\n(?P<body>.*?)^```",
    re.DOTALL | re.MULTILINE,
)
MAX_SKIPS = 4


def readme_blocks(text: str) -> list[dict]:
    """Each fenced block: its language, body, first line number, and skip reason."""
    return [
        {"lang": m["lang"], "body": m["body"], "line": text.count("\n", 0, m.start("body")) + 1, "skip": m["why"]}
        for m in BLOCK.finditer(text)
    ]


def test_block_parser_sees_languages_lines_and_skips():
    text = (
        "intro\n```bash\necho a\n```\n<!-- readme-test: skip (needs a GPU) -->\n```python\n"
        "print(1)\n```\n```yaml\nk: v\n```\n"
    )
    blocks = readme_blocks(text)
    assert [(b["lang"], b["line"], b["skip"]) for b in blocks] == [
        ("bash", 3, None),
        ("python", 7, "needs a GPU"),
        ("yaml", 10, None),
    ]
    assert blocks[0]["body"] == "echo a\n"


def example_pages() -> list[Path]:
    """README.md first, then the docs pages in their fixed order."""
    return [README, *(DOCS / f"{name}.md" for name in PAGES)]


def example_blocks() -> list[dict]:
    """The bash and python blocks of every example page, in run order, each naming its page."""
    return [
        {**block, "page": page.relative_to(ROOT).as_posix()}
        for page in example_pages()
        for block in readme_blocks(page.read_text())
        if block["lang"] in ("bash", "python")
    ]


def test_every_docs_page_runs_in_a_fixed_order():
    assert sorted(p.stem for p in DOCS.glob("*.md")) == sorted(PAGES), "add the new docs page to PAGES"
    pages_with_examples = {b["page"] for b in example_blocks() if not b["skip"]}
    assert {"README.md", "docs/commands.md", "docs/serving.md"} <= pages_with_examples


LINK = re.compile(r"\]\((?P<target>[^)#\s]+)(?:#[^)\s]*)?\)")


def test_every_relative_link_of_the_pages_names_a_file_of_the_repository():
    pages = [*example_pages(), ROOT / "BENCHMARKS.md", *sorted((DOCS / "experiments").glob("*.md"))]
    broken = [
        (page.relative_to(ROOT).as_posix(), m["target"])
        for page in pages
        for m in LINK.finditer(page.read_text())
        if "://" not in m["target"] and not (page.parent / m["target"]).exists()
    ]
    assert not broken, f"links to nothing: {broken}"


def test_every_readme_example_runs_in_order(tmp_path):
    blocks = example_blocks()
    skipped = [b for b in blocks if b["skip"]]
    assert len(skipped) <= MAX_SKIPS, f"too many blocks skipped: {[(b['page'], b['line'], b['skip']) for b in skipped]}"
    work, server = tmp_path / "work", tmp_path / "server"
    work.mkdir(), server.mkdir()
    for name in ("examples", "configs", "scripts"):
        (work / name).symlink_to(ROOT / name)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
    }
    with ForkServer(server, env) as shim_env:
        _run_blocks(blocks, work, shim_env)


def _run_blocks(blocks: list[dict], cwd: Path, env: dict) -> None:
    for block in blocks:
        if block["skip"]:
            continue
        argv = (
            ["bash", "-euo", "pipefail", "-c", block["body"]]
            if block["lang"] == "bash"
            else [sys.executable, "-c", block["body"]]
        )
        result = _run(argv, cwd, env)
        assert result.returncode == 0, (
            f"{block['page']} line {block['line']}: this {block['lang']} block exited {result.returncode}:\n"
            f"{block['body']}"
            f"--- its stderr (end):\n{result.stderr[-3000:]}\n"
            "Fix the example so it runs as written from the repository root, after the blocks before it (README.md, "
            "then docs/ in the order of PAGES); a block "
            "that cannot run here (GPU, network) gets `<!-- readme-test: skip (why) -->` on the line before it."
        )


def _run(argv: list[str], cwd: Path, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run a block in its own process group, so a block that times out leaves nothing running."""
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        err += f"\n[timed out after {timeout:.0f} s]"
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def test_the_fork_server_shim_behaves_as_the_installed_command(tmp_path):
    """What the README test trusts: exit codes, stdout, stderr, stdin, working folder and
    environment reach the command and come back as with the console script."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    (tmp_path / "m.safetensors").symlink_to(ROOT / "examples" / "demo" / "model.safetensors")  # relative: cwd travels
    (tmp_path / "x.yaml").write_text("model: ${HP_TEST_MODEL}\ndata: d.jsonl\nstages:\n  - command: score\n")
    script = (
        'headprune inspect m.safetensors --json | python -c "import json, sys; '
        "print(json.load(sys.stdin)['family'])\"\n"
        'headprune select missing.json -o plan.json || echo "exit $?"\n'
        'echo "{" | headprune select - -o plan.json 2>/dev/null || echo "stdin exit $?"\n'
        "HP_TEST_MODEL=nowhere.safetensors headprune run x.yaml --check 2>&1 | head -c 300\n"
    )
    with ForkServer(tmp_path, env) as shim_env:
        result = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, env=shim_env)
    lines = result.stdout.splitlines()
    assert lines[:3] == ["reference", "exit 1", "stdin exit 1"], result
    assert "nowhere.safetensors" in lines[3] and lines[3].startswith("Error:"), result  # the environment travelled
    assert result.stderr.startswith("Error:") and "missing.json" in result.stderr
    assert not (tmp_path / "plan.json").exists()
