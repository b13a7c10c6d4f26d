"""Where a checkout finds llama.cpp's engine environment: its .engines link, else the finished
build the build script names in the machine's engine cache."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from headprune_cli.model.llama_cpp_env import checkout_env

ROOT = Path(__file__).resolve().parents[2]


def _checkout(tmp_path: Path) -> Path:
    """A checkout holding only the build scripts (their sha is the cache key)."""
    engines = tmp_path / "clone" / "scripts" / "engines"
    engines.mkdir(parents=True)
    for name in ("llama_cpp.sh", "_cache.sh"):
        shutil.copy(ROOT / "scripts" / "engines" / name, engines / name)
    return tmp_path / "clone"


def _env(folder: Path, built: bool) -> Path:
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").write_text("")
    if built:
        (folder / ".headprune-built").write_text("stamp\n")
    return folder


def test_a_fresh_clone_finds_the_cached_build_only_once_it_is_finished(tmp_path, monkeypatch):
    root = _checkout(tmp_path)
    cache = tmp_path / "cache"
    monkeypatch.setenv("HEADPRUNE_ENGINE_CACHE", str(cache))
    monkeypatch.delenv("HEADPRUNE_LLAMA_CPP_ENV", raising=False)
    assert checkout_env(root) == root / ".engines" / "llama-cpp"  # nothing built: the refusal names the link
    building = _env(_where(root), built=False)
    assert building.parent == cache
    assert checkout_env(root) == root / ".engines" / "llama-cpp"  # no stamp yet: still building
    (building / ".headprune-built").write_text("stamp\n")
    assert checkout_env(root) == building


def test_the_clones_own_link_wins_over_the_cache(tmp_path, monkeypatch):
    root = _checkout(tmp_path)
    monkeypatch.setenv("HEADPRUNE_ENGINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HEADPRUNE_LLAMA_CPP_ENV", raising=False)
    _env(_where(root), built=True)
    linked = _env(root / ".engines" / "llama-cpp", built=False)
    assert checkout_env(root) == linked


def _where(root: Path) -> Path:
    """The cache folder the build script would build or reuse (it builds nothing with --where)."""
    done = subprocess.run(
        ["bash", str(root / "scripts/engines/llama_cpp.sh"), "--where"], capture_output=True, text=True
    )
    return Path(done.stdout.strip())
