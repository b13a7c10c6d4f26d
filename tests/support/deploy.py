"""Run a consumer (transformers, sentence-transformers, onnxruntime) in a fresh Python
process that cannot import headprune_cli: what a user's serving machine sees."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# -I drops PYTHONPATH, the user site and the script's folder from sys.path; the finder
# below also blocks an installed (editable) headprune_cli. The script checks both.
_PRELUDE = """
import sys

class _NoHeadprune:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "headprune_cli":
            raise ImportError("headprune_cli is not importable in this process")

sys.meta_path.insert(0, _NoHeadprune())
try:
    import headprune_cli
except ImportError:
    pass
else:
    raise SystemExit("headprune_cli is importable; the test would prove nothing")
"""

_EPILOGUE = """
assert not [m for m in sys.modules if m.partition(".")[0] == "headprune_cli"]
"""


def run_without_headprune(script: str, cwd: Path, *args: str, python: str = sys.executable) -> str:
    """Run `script` (Python source; `sys.argv[1:]` = args) and return its stdout; `python` is
    the interpreter (an engine's own environment, such as llama.cpp's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [python, "-I", "-c", _PRELUDE + script + _EPILOGUE, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout
