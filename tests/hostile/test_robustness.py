"""Reliability of the readers and writers: kills mid-write, fuzzed metadata and artifacts."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from headprune_cli import load, save
from headprune_cli.artifacts.schema import parse_artifact
from headprune_cli.errors import HeadpruneError
from headprune_cli.model.checkpoint import read_info
from tests.support import TINY

_KEYS = [
    "format",
    "version",
    "family",
    "architecture",
    "config",
    "layout",
    "task",
    "tokenizer_config",
    "pooling",
    "provenance",
]
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
_layout_like = st.fixed_dictionaries(
    {
        "num_heads": st.lists(st.integers(-1, 5), max_size=4),
        "num_kv_heads": st.lists(st.integers(-1, 5), max_size=4),
        "layers": st.lists(st.integers(-1, 4), max_size=4),
        "heads": st.lists(st.lists(st.integers(-1, 5), max_size=4), max_size=4),
        "kv_heads": st.lists(st.lists(st.integers(-1, 5), max_size=4), max_size=4),
    }
)


def _valid_metadata(tmp_path_factory) -> dict[str, str]:
    path = tmp_path_factory.mktemp("valid") / "m.safetensors"
    save(TINY["bert"](), path)
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        return json.loads(handle.read(length))["__metadata__"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    key=st.sampled_from(_KEYS),
    value=st.one_of(st.text(max_size=30), _json_values.map(json.dumps), _layout_like.map(json.dumps)),
)
def test_fuzzed_checkpoint_metadata_only_raises_headprune_errors(tmp_path_factory, key, value):
    metadata = _valid_metadata(tmp_path_factory)
    metadata[f"headprune.{key}"] = value
    path = tmp_path_factory.mktemp("fuzz") / "f.safetensors"
    save_file({"w": torch.zeros(1)}, str(path), metadata=metadata)
    try:
        read_info(path)
        load(path)
    except HeadpruneError:
        pass


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_bytes_are_refused_as_checkpoints(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("bytes") / "r.safetensors"
    path.write_bytes(data)
    try:
        load(path)
    except HeadpruneError:
        return
    raise AssertionError("random bytes loaded as a checkpoint")


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["scores", "plan", "report", "other"]),
    fields=st.dictionaries(
        st.sampled_from(
            [
                "schema_version",
                "inputs",
                "config",
                "heads",
                "kept",
                "remove_heads",
                "num_heads",
                "shape",
                "created",
                "cost",
            ]
        ),
        _json_values,
        max_size=6,
    ),
)
def test_fuzzed_artifacts_only_raise_headprune_errors(kind, fields):
    text = json.dumps({"kind": kind, "schema_version": 1, **fields})
    try:
        parse_artifact(text, "fuzz", ("scores", "plan"))
    except HeadpruneError:
        pass


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=80))
def test_arbitrary_text_is_refused_as_an_artifact(text):
    try:
        parse_artifact(text, "fuzz", ("scores", "plan"))
    except HeadpruneError:
        return
    raise AssertionError("arbitrary text parsed as an artifact")


_WRITER = """
import sys, torch
from headprune_cli import save
from headprune_cli.model.arch import ReferenceConfig, ReferenceEncoder
torch.manual_seed(0)
config = ReferenceConfig(vocab_size=30000, hidden_size=512, heads_per_layer=[8, 8], head_dim=64, intermediate_size=2048)
model = ReferenceEncoder(config)
save(model, sys.argv[2])  # the bytes every complete write produces
print("ready", flush=True)
while True:
    save(model, sys.argv[1], overwrite=True)  # replaces the target again and again
"""


def test_sigkill_while_writing_leaves_old_file_or_new_file(tmp_path):
    """Killed in the middle of a write, the target holds the old bytes or the complete new
    bytes (by sha256), never a mix; the writer is killed and reaped whatever happens."""
    target, whole = tmp_path / "m.safetensors", tmp_path / "whole" / "new.safetensors"
    whole.parent.mkdir()
    save(TINY["reference"](), target)
    old = hashlib.sha256(target.read_bytes()).hexdigest()
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(target), str(whole)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".m.safetensors.*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.005)  # wait until a write is in progress
        assert list(tmp_path.glob(".m.safetensors.*.tmp")), "the writer never started writing"
    finally:
        proc.kill()  # SIGKILL
        proc.wait(timeout=60)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    new = hashlib.sha256(whole.read_bytes()).hexdigest()
    assert new != old
    assert hashlib.sha256(target.read_bytes()).hexdigest() in (old, new)
    load(target)  # and it reads back


def test_outputs_get_the_usual_file_mode(tmp_path):
    old = os.umask(0o022)
    try:
        save(TINY["reference"](), tmp_path / "m.safetensors")
    finally:
        os.umask(old)
    assert (tmp_path / "m.safetensors").stat().st_mode & 0o777 == 0o644


def test_file_hash_follows_changes_to_the_file(tmp_path):
    from headprune_cli.files.io import sha256_bytes, sha256_file

    path = tmp_path / "f.bin"
    path.write_bytes(b"one")
    assert sha256_file(path) == sha256_bytes(b"one")
    path.write_bytes(b"two, longer")
    assert sha256_file(path) == sha256_bytes(b"two, longer")
    save(TINY["reference"](), tmp_path / "m.safetensors")
    first = sha256_file(tmp_path / "m.safetensors")
    save(TINY["bert"](), tmp_path / "m.safetensors", overwrite=True)  # atomic replace: a new inode
    assert sha256_file(tmp_path / "m.safetensors") != first


def test_a_hash_started_ahead_is_the_files_hash_and_follows_changes(tmp_path):
    """hash_ahead (hashing while a layout is built) gives what sha256_file would; a file
    changed after the hash started is hashed again; what cannot be hashed is left to
    sha256_file's refusal."""
    from headprune_cli.errors import HeadpruneError
    from headprune_cli.files.io import hash_ahead, sha256_file

    path = tmp_path / "f.bin"
    data = os.urandom(3 << 20)  # more than one read chunk
    path.write_bytes(data)
    hash_ahead(path)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    hash_ahead(path)
    path.write_bytes(b"changed")
    assert sha256_file(path) == hashlib.sha256(b"changed").hexdigest()
    os.mkfifo(tmp_path / "fifo")
    for bad in (tmp_path / "missing", tmp_path / "fifo", tmp_path):
        hash_ahead(bad)  # returns at once, never blocks on the FIFO
        with pytest.raises(HeadpruneError):
            sha256_file(bad)
