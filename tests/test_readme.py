"""README examples: the block parser (tested here) and `_run`, which runs one block in its
own process group. The test that runs every block in order is held back until it has had
one verified run (see the closing note of this round).

The ```bash and ```python blocks run in order, each in its own process, in one scratch
folder that holds what the repository ships (examples/, configs/, scripts/), with this
tree's `headprune` on PATH: what a new user gets by pasting them one after another. A
block right after `<!-- readme-test: skip (why) -->` is not run; skips stay few.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"(?:<!-- readme-test: skip \((?P<why>[^)]+)\) -->\n)?```(?P<lang>[a-z]*)\n(?P<body>.*?)^```", re.S | re.M)
MAX_SKIPS = 4


def readme_blocks(text: str) -> list[dict]:
    """Each fenced block: its language, body, first line number, and skip reason."""
    return [
        {"lang": m["lang"], "body": m["body"], "line": text.count("\n", 0, m.start("body")) + 1, "skip": m["why"]}
        for m in BLOCK.finditer(text)
    ]


def test_block_parser_sees_languages_lines_and_skips():
    text = "intro\n```bash\necho a\n```\n<!-- readme-test: skip (needs a GPU) -->\n```python\nprint(1)\n```\n```yaml\nk: v\n```\n"
    blocks = readme_blocks(text)
    assert [(b["lang"], b["line"], b["skip"]) for b in blocks] == [("bash", 3, None), ("python", 7, "needs a GPU"), ("yaml", 10, None)]
    assert blocks[0]["body"] == "echo a\n"


def _run(argv: list[str], cwd: Path, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run a block in its own process group, so a block that times out leaves nothing running."""
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        err += f"\n[timed out after {timeout:.0f} s]"
    return subprocess.CompletedProcess(argv, process.returncode, out, err)
