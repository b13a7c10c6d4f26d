"""What a command may write, replace and delete: the one rule every output check goes through.

1. No output may resolve (after symlinks) to a file the command reads, lie inside a
   folder it reads, or contain one: not the files on its command line, and not those it
   reaches through provenance (a checkpoint's parent and root, the inputs an artifact
   names), which `--teacher auto` and `--baseline auto` read without being named.
2. An existing file is replaced only with `--force`; so is a dangling symlink. Even with
   it, weights and JSON headprune did not write are refused: a safetensors file without
   headprune's metadata (a transformers or trainer checkpoint, an HF shard) or JSON that
   is not a headprune artifact (a config.json). Those are recognised by their content,
   whatever their name.
3. headprune deletes or fills only folders it made: a folder it creates carries MARKER,
   and a non-empty folder without it is refused, with or without `--force` (`--force`
   replaces earlier outputs, never a user's folder).
No heavy imports here: `select` and `--help` load this module.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from headprune_cli.errors import HeadpruneError, UsageError
from headprune_cli.files.special import special_output

MARKER = ".headprune"
# An `export --hf` folder is marked by its headprune.json, which it needs anyway; no dotfile
# is added to a folder that users upload to a model hub.
MARKERS = (MARKER, "headprune.json")
MARKER_TEXT = "headprune made this folder; headprune may replace or delete it.\n"
_MAX_PROVENANCE = 64  # paths followed through provenance per command (lineage is short)
_MAX_ARTIFACT_PEEK = 64 * 1024 * 1024  # larger JSON inputs or headers are not read for provenance
CHECKPOINT_FORMAT = "headprune-checkpoint"  # checkpoint.py's headprune.format (that module imports torch)


# --- inputs: what a command reads -----------------------------------------------------
def reads(inputs: Iterable[str | os.PathLike | None]) -> list[Path]:
    """The given inputs plus every path their provenance names (parents, roots, artifact inputs)."""
    seen: dict[str, Path] = {}
    queue = [Path(p) for p in inputs if p is not None and str(p) not in ("-", "", "auto", "self")]
    while queue and len(seen) < _MAX_PROVENANCE:
        path = queue.pop(0)
        key = os.path.realpath(path)
        if key in seen:
            continue
        seen[key] = path
        # Only files (and export folders) count when reached through provenance: a
        # checkpoint naming `/` as its root must not make every output "inside an input".
        queue += [p for p in _named_by(path) if p.is_file() or (p / "headprune.json").is_file()]
    return list(seen.values())


def _named_by(path: Path) -> list[Path]:
    """Paths a checkpoint's provenance or a JSON artifact's `inputs` name; [] when unreadable.

    Only regular files and export folders are opened (never a FIFO or a device), and a
    broken file is left for the command itself to report with its own message."""
    try:
        if path.is_dir() and (path / "headprune.json").is_file():
            provenance = json.loads((path / "headprune.json").read_text(encoding="utf-8")).get("provenance", {})
            return _provenance_paths(provenance, path.parent)
        if not path.is_file():
            return []
        if path.suffix == ".safetensors":
            return _provenance_paths(_checkpoint_provenance(path), path.parent)
        if path.suffix == ".json":
            refs = _peek_json(path).get("inputs", [])
            named = [Path(r["path"]) for r in refs if isinstance(r, dict) and isinstance(r.get("path"), str)]
            return named + [path.parent / n for n in named if not n.is_absolute()]
    except (OSError, ValueError, AttributeError, TypeError, RecursionError, HeadpruneError):
        pass
    return []


def _checkpoint_provenance(path: Path) -> dict:
    """The provenance in a safetensors header, read without torch (`select` must stay light)."""
    return json.loads((_safetensors_metadata(path) or {}).get("headprune.provenance", "{}"))  # checkpoint.py's key


def _safetensors_metadata(path: Path) -> dict | None:
    """The `__metadata__` of a safetensors file's header; None when the file is not framed as
    one (8-byte length, then a JSON object within the file). ValueError for a broken header."""
    with open(path, "rb") as handle:
        start = handle.read(9)
        length = int.from_bytes(start[:8], "little")
        if start[8:9] != b"{" or not 0 < length <= min(path.stat().st_size - 8, _MAX_ARTIFACT_PEEK):
            return None
        handle.seek(8)
        return json.loads(handle.read(length)).get("__metadata__") or {}


def _peek_json(path: Path):
    """A JSON file's content, read only up to the peek limit (a /proc file reports size 0 and
    never ends); ValueError when larger or not JSON."""
    with open(path, "rb") as handle:
        text = handle.read(_MAX_ARTIFACT_PEEK + 1)
    if len(text) > _MAX_ARTIFACT_PEEK:
        raise ValueError(f"{path} is larger than {_MAX_ARTIFACT_PEEK} bytes")
    return json.loads(text)


def _provenance_paths(provenance, folder: Path) -> list[Path]:
    if not isinstance(provenance, dict):
        return []
    return [folder / p for key in ("root_path", "parent_path") if isinstance(p := provenance.get(key), str)]


def _within(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def refuse_overlap(out: str | os.PathLike, inputs: Iterable[str | os.PathLike | None]) -> None:
    """Refuse an output that is, contains, or lies inside anything the command reads."""
    target = os.path.realpath(out)
    for path in reads(inputs):
        source = os.path.realpath(path)
        if target == source or _same_file(out, path):
            raise UsageError(f"output {out} is also an input ({path}); choose another output path")
        if _within(target, source) and os.path.isdir(source):
            raise UsageError(f"output {out} is inside the input folder {path}; choose a path outside it")
        if _within(source, target):
            raise UsageError(f"output {out} contains the input {path}; choose another output path")


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)  # hard links and bind mounts too
    except OSError:
        return False


# --- new outputs: published without replacing -----------------------------------------
# Outputs that did not exist when the command checked them, without --force: another
# process making one meanwhile (two `prune -o x` at once) must not be overwritten, so they
# are published with a rename that refuses to replace (temps.publish, make_folder).
_CLAIMED: set[str] = set()


def claim_new(path: str | os.PathLike) -> None:
    _CLAIMED.add(os.path.realpath(path))


def is_claimed(path: str | os.PathLike) -> bool:
    return os.path.realpath(path) in _CLAIMED


def release_claim(path: str | os.PathLike) -> None:
    _CLAIMED.discard(os.path.realpath(path))


@contextmanager
def own_claims() -> Iterator[None]:
    """A command starts with no claims and leaves none behind: tests run many commands in
    one process, and `headprune run` runs its stages inside its own command."""
    outer = set(_CLAIMED)
    _CLAIMED.clear()
    try:
        yield
    finally:
        _CLAIMED.clear()
        _CLAIMED.update(outer)


# --- file outputs ---------------------------------------------------------------------
def check_output(path: str | os.PathLike, force: bool = False, inputs: Iterable[str | os.PathLike | None] = ()) -> Path:
    """A file output: not an input (see the module doc), replaced only with --force."""
    out = Path(path)
    refuse_overlap(out, inputs)
    refuse_special(out)
    existed = os.path.lexists(out)
    if existed and not out.exists() and not force:
        raise UsageError(f"{out} is a symlink to a missing file; pass --force to replace the link")
    if out.exists() and not force:
        raise UsageError(f"{out} exists; pass --force to overwrite it")
    if out.is_dir():
        raise UsageError(f"{out} is a directory, not a file")
    if out.is_file() and (what := _not_ours(out)):
        raise UsageError(
            f"{out} is {what} headprune did not write; --force replaces only headprune's outputs (choose another path)"
        )
    check_parent(out)
    _claim_unless_forced(out, force, existed)
    return out


def refuse_special(out: Path, what: str = "output") -> None:
    """Never replace a device, FIFO, socket or /dev, /proc, /sys entry, even with --force (special.py)."""
    why = special_output(out)
    if why:
        hint = " (for stdout give -o - or no -o)" if what == "output" else ""
        raise UsageError(f"{what} {out} {why}; headprune never replaces one, even with --force{hint}")


def _claim_unless_forced(out: Path, force: bool, existed: bool) -> None:
    """Claim `out` as new when it did not exist at the checks: decided by that one look, so a
    file another process publishes between the checks and here is still refused at the rename."""
    if force:
        release_claim(out)
    elif not existed:
        claim_new(out)


def check_parent(out: Path) -> None:
    """The folder an output goes into must exist and be writable."""
    parent = out.parent
    if not parent.is_dir():
        raise UsageError(f"output folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise HeadpruneError(f"output folder {parent} is not writable")


def check_distinct(paths: Iterable[str | os.PathLike]) -> None:
    """Two outputs of one command may neither be one file nor lie one inside the other."""
    resolved = [(p, os.path.realpath(p)) for p in paths]
    for i, (a, ra) in enumerate(resolved):
        for b, rb in resolved[i + 1 :]:
            if _within(ra, rb) or _within(rb, ra):
                raise UsageError(f"outputs {a} and {b} overlap; give each its own path")


def _not_ours(path: Path) -> str | None:
    """What an existing file is, when its content shows another tool wrote it; None when
    headprune wrote it or the content is neither safetensors nor JSON (a report, a plot, ONNX)."""
    try:
        try:
            metadata = _safetensors_metadata(path)
        except (ValueError, AttributeError, RecursionError):
            return "a safetensors file"  # framed as one, with a header no tool of ours wrote
        if metadata is not None:
            return None if metadata.get("headprune.format") == CHECKPOINT_FORMAT else "a safetensors file"
        with open(path, "rb") as handle:
            if handle.read(4096).lstrip()[:1] not in (b"{", b"["):
                return None
        try:
            artifact = _peek_json(path)
        except (ValueError, RecursionError):
            return "a JSON file"  # over the peek limit, nested too deep, or not JSON after all
        ours = isinstance(artifact, dict) and isinstance(artifact.get("kind"), str) and "headprune_version" in artifact
        return None if ours else "a JSON file"
    except OSError:
        return None  # unreadable: the write itself will report it


# --- folder outputs -------------------------------------------------------------------
def owned(folder: str | os.PathLike) -> bool:
    """Whether headprune may fill, replace or delete this folder: it made it, or it is empty."""
    path = Path(folder)
    if not path.is_dir() or path.is_symlink():
        return False
    return any((path / m).is_file() for m in MARKERS) or not any(path.iterdir())


def check_folder(
    path: str | os.PathLike,
    inputs: Iterable[str | os.PathLike | None] = (),
    what: str = "output folder",
    force: bool = False,
) -> Path:
    """A folder headprune will write into (or replace): new, empty, or made by headprune.

    Nothing is created here, so a refusal later in the command leaves no empty folder.
    A folder that does not exist yet is claimed (without `force`): when another process
    creates it before this one does, this one fails instead of sharing it."""
    out = Path(path)
    refuse_overlap(out, inputs)
    refuse_special(out, what)
    existed = os.path.lexists(out)
    if existed and not out.is_dir():
        raise UsageError(f"{what} {out} is a file, not a folder")
    if out.is_dir() and not owned(out):
        raise UsageError(
            f"{what} {out} holds files headprune did not write; refusing to touch it (give a new or empty folder)"
        )
    if not out.exists():
        parent = _existing_ancestor(out)
        if not os.access(parent, os.W_OK):
            raise HeadpruneError(f"cannot create {what} {out}: {parent} is not writable")
    _claim_unless_forced(out, force, existed)
    return out


def make_folder(path: str | os.PathLike) -> Path:
    """Create (or adopt, when empty) a folder and mark it as headprune's."""
    out = Path(path)
    if is_claimed(out):
        try:
            out.mkdir(parents=True)
        except FileExistsError:
            raise HeadpruneError(
                f"{out} now exists: another process created it while this one ran; "
                "it was left as it is (choose another folder)"
            ) from None
        release_claim(out)
    if out.is_dir() and not owned(out):
        raise UsageError(f"{out} holds files headprune did not write; refusing to touch it")
    out.mkdir(parents=True, exist_ok=True)
    marker = out / MARKER
    if not any((out / m).is_file() for m in MARKERS):
        marker.write_text(MARKER_TEXT)
    return out


def remove_folder(path: str | os.PathLike) -> None:
    """Delete a folder headprune made; anything else is left alone."""
    out = Path(path)
    if out.is_dir() and not out.is_symlink() and any((out / m).is_file() for m in MARKERS):
        shutil.rmtree(out, ignore_errors=True)


def _existing_ancestor(path: Path) -> Path:
    for parent in [path, *path.absolute().parents]:
        if parent.exists():
            return parent
    return Path(".")


@contextmanager
def exclusive(folder: str | os.PathLike, what: str) -> Iterator[None]:
    """Hold an exclusive lock on a folder's marker while writing into it.

    A second process asking for it is refused at once rather than waiting: two runs
    writing one folder would mix their artifacts. The kernel drops the lock when the
    process dies, so a killed run never leaves a stale lock."""
    try:
        import fcntl  # noqa: PLC0415 (POSIX only)
    except ImportError:  # not POSIX: no advisory locks; go on unlocked
        yield
        return
    marker = Path(folder) / MARKER
    with open(marker, "a", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise HeadpruneError(
                f"{folder} is in use by another {what}; wait for it to finish or choose another folder"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
