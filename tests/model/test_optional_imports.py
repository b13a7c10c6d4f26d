"""The CLI builds models without transformers' scipy import; a library caller's process keeps it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from headprune_cli import save
from tests.support import TINY

PROBE = """
import sys
from headprune_cli.cli.app import main
from headprune_cli.model.checkpoint import load
if sys.argv[1] == "cli":
    assert main(["inspect", sys.argv[2]]) == 0
else:
    load(sys.argv[2])
import transformers.utils
print("scipy" in sys.modules, transformers.utils.is_scipy_available())
"""


@pytest.mark.skipif(importlib.util.find_spec("scipy") is None, reason="scipy is not installed")
def test_only_the_cli_leaves_scipy_out(tmp_path):
    path = tmp_path / "m.safetensors"
    save(TINY["llama-gqa"](), path)
    env = {**os.environ, "HEADPRUNE_NO_WATCHER": "1"}

    def probe(mode: str) -> str:
        argv = [sys.executable, "-c", PROBE, mode, str(path)]
        return subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout.split("\n")[-2]

    assert probe("cli") == "False False"
    assert probe("library") == "True True"
