"""Memory bombs (a header declaring 30,000 layers, a config declaring a huge MLP and
vocabulary, a 50 MB data line, a YAML alias bomb) run as real `headprune` processes under
an address-space limit: each must end with its clear one-line answer inside the limit,
where today's main runs out of memory, aborts in the tokenizer, or prints gigabytes.

The limit is 3 GiB of address space (RLIMIT_AS): importing torch and transformers and
scoring the demo model needs about 0.8 GiB (measured: score passes at 0.8 GiB and fails
at 0.5 GiB), and each bomb asks for 3-8 GB.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import BOMBS, ROOT

LIMIT = 3 << 30


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def run_limited(args: list) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "headprune_cli", *map(str, args)],
        preexec_fn=_limited,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "examples" / "demo" / "model.safetensors", tmp_path / "model.safetensors")
    rows = (ROOT / "examples" / "demo" / "dev.jsonl").read_text().splitlines()[:8]
    (tmp_path / "data.jsonl").write_text("\n".join(rows) + "\n")
    return tmp_path


# bomb -> (exit code, a piece of the one error line); None: the run must succeed.
EXPECTED = {
    "many-layers": (1, "must list 1 to 1024 layers"),
    "wide-config": (1, "matches no stored tensor's shape"),
    "alias-bomb": (2, "aliases"),
    "long-line": None,
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_bomb_is_answered_within_the_memory_limit(name: str, folder: Path):
    args = BOMBS[name](folder)
    result = run_limited(args)
    assert "Traceback" not in result.stderr and "panicked" not in result.stderr, result.stderr[-2000:]
    if EXPECTED[name] is None:
        # 50 MB of text in one row: cut to what --max-length keeps, then scored like any row.
        assert result.returncode == 0, result.stderr[-2000:]
        assert (folder / "long-scores.json").is_file()
        return
    code, message = EXPECTED[name]
    lines = result.stderr.splitlines()
    assert result.returncode == code and len(lines) == 1 and lines[0].startswith("Error: "), result.stderr[-2000:]
    assert message in lines[0] and len(lines[0]) < 400, lines[0][:400]
