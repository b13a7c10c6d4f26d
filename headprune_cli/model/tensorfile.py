"""safetensors files without holding them in memory: headers, single tensors, streamed writes.

Reading: the header (names, dtypes, shapes, offsets) is parsed and checked on its own, so
`inspect` and the streamed stages never touch weights they do not need; one tensor is
memory-mapped on its own. A sharded folder (`model.safetensors.index.json`) reads as
one set of tensors.

Writing: the header is computed from (name, dtype, shape) first, with sorted keys, and the
tensors follow one at a time in a fixed order (widest dtype first, then name, so every
tensor stays aligned to its element size), so the same tensors always give the same bytes
and no file is ever held twice in memory. Above `max_shard_size` the output is split into
`model-0000i-of-0000N.safetensors` files with an index, as transformers writes them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy
import torch

from headprune_cli.errors import CheckpointError, UsageError, first_line
from headprune_cli.files.io import start_writeback
from headprune_cli.files.watcher import note_read

MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit; refuse before parsing
INDEX_NAME = "model.safetensors.index.json"
DEFAULT_MAX_SHARD = "5GB"

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
NAMES = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors file, as its header describes it."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    path: str
    start: int  # absolute byte offset in the file
    nbytes: int


# --- reading ------------------------------------------------------------------------------
def read_header(path: str | os.PathLike) -> tuple[dict[str, str], dict[str, Entry]]:
    """(string metadata, tensor entries) of one safetensors file, checked against its size."""
    note_read(path)  # its tensors are memory-mapped later: see watcher.py for a file truncated meanwhile
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES or 8 + length > size:
            raise CheckpointError(f"{path}: not a safetensors file, or truncated (bad header length)")
        raw = handle.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{path}: corrupt safetensors file ({first_line(exc)})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors file (header is not an object)")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{path}: corrupt safetensors file (metadata is not text)")
    entries = {name: _entry(path, name, spec, 8 + length) for name, spec in header.items()}
    _check_offsets(path, entries.values(), size)
    return metadata, entries


def _entry(path, name: str, spec, base: int) -> Entry:
    try:
        dtype = DTYPES[spec["dtype"]]
        shape = tuple(spec["shape"])
        begin, end = spec["data_offsets"]
        ok = all(isinstance(d, int) and d >= 0 for d in (*shape, begin, end)) and begin <= end
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok or (end - begin) != math.prod(shape) * dtype.itemsize:
        raise CheckpointError(f"{path}: corrupt safetensors file (bad entry for tensor {name!r})")
    return Entry(name, dtype, shape, str(path), base + begin, end - begin)


def _check_offsets(path, entries: Iterable[Entry], size: int) -> None:
    position = None
    for entry in sorted(entries, key=lambda e: e.start):
        if position is not None and entry.start < position:
            raise CheckpointError(f"{path}: corrupt safetensors file (tensors overlap)")
        position = entry.start + entry.nbytes
        if position > size:
            raise CheckpointError(
                f"{path}: not a safetensors file, or truncated (tensor {entry.name!r} ends past the file)"
            )


def read_entries(path: str | os.PathLike) -> dict[str, Entry]:
    """The tensors of a safetensors file, or of a sharded folder or index file."""
    path = Path(path)
    index = path / INDEX_NAME if path.is_dir() else path
    if not index.name.endswith(".index.json"):
        return read_header(path)[1]
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = sorted(set(weight_map.values()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{index}: not a valid safetensors index ({first_line(exc)})") from None
    entries: dict[str, Entry] = {}
    for name in files:
        shard = index.parent / str(name)
        if Path(str(name)).name != str(name) or not shard.is_file():
            raise CheckpointError(f"{index}: shard {name!r} is not a file in {index.parent}")
        for key, entry in read_header(shard)[1].items():
            if weight_map.get(key) != name or key in entries:
                raise CheckpointError(f"{index}: tensor {key!r} is not where the index says")
            entries[key] = entry
    return entries


def read_tensor(entry: Entry) -> torch.Tensor:
    """One tensor, memory-mapped: only its own bytes, copy-on-write (nothing done to the
    tensor reaches the file), unmapped when the tensor is freed. Mapping rather than
    reading into fresh memory saves a page of new memory to zero and a copy per page
    before the write (a read-check-write pass of a 2 GB model: 1.1 s against 3.9-6.2 s,
    BENCHMARKS §8)."""
    if not entry.nbytes:
        return torch.empty(entry.shape, dtype=entry.dtype)
    # A file cut short since its header was read: refused here, before the mapping. One
    # cut while its pages are read kills the process by SIGBUS, which watcher.py reports.
    end = entry.start + entry.nbytes
    try:
        size = os.path.getsize(entry.path)
        if size < end:
            raise CheckpointError(
                f"{entry.path} changed while headprune read it (truncated to {size} bytes; "
                f"tensor {entry.name!r} ends at {end})"
            )
        mapped = numpy.memmap(entry.path, dtype=numpy.uint8, mode="c", offset=entry.start, shape=(entry.nbytes,))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{entry.path} changed while headprune read it ({first_line(exc)})") from None
    return torch.from_numpy(mapped).view(entry.dtype).reshape(entry.shape)


# --- writing ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """A tensor to write: its header facts now, its values (`produce()`) when its turn comes."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    produce: Callable[[], torch.Tensor]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def ordered(specs: Iterable[Spec]) -> list[Spec]:
    """Widest elements first keeps every tensor aligned; then by name for determinism."""
    return sorted(specs, key=lambda s: (-s.dtype.itemsize, NAMES[s.dtype], s.name))


def write_file(path: str | os.PathLike, specs: list[Spec], metadata: dict[str, str]) -> str:
    """Write one safetensors file: sorted header, then each tensor streamed in order.
    Returns the file's sha256, computed from the bytes as they are written."""
    specs = ordered(specs)
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for spec in specs:
        header[spec.name] = {
            "dtype": NAMES[spec.dtype],
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # keep the data buffer 8-byte aligned
    with open(path, "wb") as handle, _HashingWriter(handle) as out:
        out.write(struct.pack("<Q", len(text)) + text)
        for spec in specs:
            tensor = spec.produce()
            if tuple(tensor.shape) != spec.shape or tensor.dtype != spec.dtype:
                raise CheckpointError(
                    f"tensor {spec.name!r} is {tensor.dtype} {list(tensor.shape)}, "
                    f"expected {spec.dtype} {list(spec.shape)}"
                )
            if spec.nbytes:
                out.write(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
        return out.hexdigest()


class _HashingWriter:
    """Writes to a file and hashes what it wrote. The hash of one chunk runs on a worker
    thread while the caller produces and writes the next (hashlib and file writes release
    the GIL), so hashing a multi-GB file costs no pass of its own; the worker also starts
    the chunk's writeback to disk, so the final fsync has little left to wait for. At most
    two chunks are alive at a time: the one being hashed and the one being written."""

    def __init__(self, handle):
        self._handle = handle
        self._digest = hashlib.sha256()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256")
        self._pending: Future | None = None
        self._offset = 0

    def write(self, data) -> None:
        self._handle.write(data)
        self._wait()
        size = memoryview(data).nbytes
        self._pending = self._worker.submit(self._consume, data, self._offset, size)  # keeps `data` alive until hashed
        self._offset += size

    def _consume(self, data, offset: int, size: int) -> None:
        self._digest.update(data)
        start_writeback(self._handle.fileno(), offset, size)

    def hexdigest(self) -> str:
        self._wait()
        return self._digest.hexdigest()

    def _wait(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def __enter__(self) -> _HashingWriter:
        return self

    def __exit__(self, *exc) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)


def parse_size(text: str) -> int:
    """'5GB', '500MB', '2GiB' or a byte count, as transformers' max_shard_size reads it."""
    units = {
        "": 1,
        "B": 1,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "TB": 10**12,
        "KIB": 2**10,
        "MIB": 2**20,
        "GIB": 2**30,
        "TIB": 2**40,
    }
    raw = text.strip().upper()
    number = raw.rstrip("KMGTIB")
    unit = raw[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or not value > 0 or not math.isfinite(value):
        raise UsageError(f"--max-shard-size {text!r}: expected a size like 5GB, 500MB or 2GiB")
    return int(value * units[unit])


def shard(specs: list[Spec], max_bytes: int) -> list[list[Spec]]:
    """Consecutive groups (in write order) of at most max_bytes each; a bigger tensor goes alone."""
    groups: list[list[Spec]] = [[]]
    size = 0
    for spec in ordered(specs):
        if groups[-1] and size + spec.nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(spec)
        size += spec.nbytes
    return groups


def write_folder_weights(
    folder: Path, specs: list[Spec], metadata: dict[str, str], max_bytes: int, stem: str = "model"
) -> dict[str, str]:
    """STEM.safetensors, or shards plus STEM.safetensors.index.json (transformers' names
    when `stem` is "model"); returns the weight files written, each with its sha256."""
    groups = shard(specs, max_bytes)
    if len(groups) == 1:
        return {f"{stem}.safetensors": write_file(folder / f"{stem}.safetensors", groups[0], metadata)}
    names = [f"{stem}-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    weight_map, written = {}, {}
    for name, group in zip(names, groups):
        written[name] = write_file(folder / name, group, metadata)
        weight_map.update({spec.name: name for spec in group})
    index = {"metadata": {"total_size": sum(s.nbytes for s in specs)}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / f"{stem}.safetensors.index.json").write_text(
        json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return written
