"""A source file cut short by another process while headprune reads it: one `Error:` line
naming the file (exit 1), no temporary left, the other inputs as they were.

A cut before a tensor is mapped is caught by the size check in tensorfile.read_tensor; a
cut after the mapping makes the next access to the lost pages raise SIGBUS, which kills
the process outright: the watching parent of the console entry point (watcher.py) then
names the file and removes the temporaries. The hooks below truncate the file at those two
moments, in a real process started through that entry point.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import transformers as T

from tests.support import assert_one_error, finished, headprune, leftovers, snapshot

HOOK = textwrap.dedent("""
    import os, sys
    import headprune_cli.model.{module} as target
    real = target.{function}
    calls = [0]

    def reading(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 2 and {before}:  # another process cuts the file before this tensor is mapped
            os.truncate({victim!r}, 4096)
        result = real(*args, **kwargs)
        if calls[0] == {after}:  # ... or after it is mapped, before its pages are read
            os.truncate({victim!r}, 4096)
        return result

    target.{function} = reading
    from headprune_cli.cli.app import run
    run()
""")


def hook(
    victim: Path, *, module: str = "streaming", function: str = "read_tensor", before: bool = False, after: int = 2
) -> Path:
    """A script that truncates `victim` to 4 KB at the given call of `module.function`, then runs headprune."""
    script = victim.parent.parent / "hook.py"
    script.write_text(
        HOOK.format(module=module, function=function, before=before, after=-1 if before else after, victim=str(victim))
    )
    return script


def _refused_and_clean(work: Path, process, source: Path, keep: list[Path], outputs: list[Path], fragment: str) -> None:
    kept = {p: p.read_bytes() for p in keep}
    code, out, err = finished(process)
    assert_one_error(code, err, 1, f"{source} changed while headprune read it ({fragment}")
    assert out == "" and leftovers(work) == []
    assert all(not p.exists() for p in outputs)
    assert all(p.read_bytes() == data for p, data in kept.items())  # the inputs not cut are byte for byte the same


# "truncated from A to B bytes" is the watcher's report of a SIGBUS; "truncated to B bytes" the size check's.
@pytest.mark.parametrize("moment", ["after-mapping"])  # before the mapping: the in-process test at the end
def test_prune_of_a_source_truncated_while_read(work, moment):
    source = work / "model.safetensors"
    size = source.stat().st_size
    script = hook(source, before=moment == "before-mapping")
    keep = [work / "plan.json", work / "scores.json", work / "data.jsonl"]
    process = headprune(
        "prune", source, "--plan", work / "plan.json", "-o", work / "small.safetensors", cwd=work, script=script
    )
    reported = (
        f"truncated from {size} to 4096 bytes); nothing was written"
        if moment == "after-mapping"
        else "truncated to 4096 bytes"
    )
    _refused_and_clean(work, process, source, keep, [work / "small.safetensors"], reported)


def test_export_hf_of_a_source_truncated_while_read(work):
    source = work / "model.safetensors"
    size = source.stat().st_size
    process = headprune("export", source, "--hf", work / "exported", cwd=work, script=hook(source, after=3))
    _refused_and_clean(
        work, process, source, [work / "plan.json"], [work / "exported"], f"truncated from {size} to 4096"
    )


@pytest.fixture
def hf_folder(work) -> Path:
    import torch

    torch.manual_seed(0)
    model = T.BertModel(
        T.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
    )
    model.save_pretrained(work / "hf")
    return work / "hf"


def test_import_of_a_shard_truncated_while_read(work, hf_folder):
    """transformers maps the shard when it loads the folder; it is cut before headprune
    writes the checkpoint from those tensors."""
    shard = hf_folder / "model.safetensors"
    config, size = (hf_folder / "config.json").read_bytes(), shard.stat().st_size
    script = hook(shard, module="importer", function="_from_pretrained", after=1)
    process = headprune("import", hf_folder, "-o", work / "imported.safetensors", cwd=work, script=script)
    _refused_and_clean(
        work,
        process,
        shard,
        [hf_folder / "config.json"],
        [work / "imported.safetensors"],
        f"truncated from {size} to 4096",
    )
    assert (hf_folder / "config.json").read_bytes() == config


def test_a_truncated_source_in_process_is_one_error_line(work, cli):
    """The size check alone, without the watcher: a library caller or the in-process CLI."""
    import headprune_cli.model.streaming as streaming

    source = work / "model.safetensors"
    real, calls = streaming.read_tensor, []

    def reading(entry):
        # Cut the file just after the first tensor's bytes: that tensor may still be being
        # hashed on the writer's thread, and a cut inside its pages would kill this very
        # process by SIGBUS (what the watcher reports for a real command).
        calls.append(entry)
        if len(calls) == 2:
            import os

            os.truncate(source, calls[0].start + calls[0].nbytes)
        return real(entry)

    streaming.read_tensor = reading
    try:
        before = {k: v for k, v in snapshot(work).items() if k != "model.safetensors"}
        result = cli("prune", source, "--plan", work / "plan.json", "-o", work / "small.safetensors")
    finally:
        streaming.read_tensor = real
    cut = calls[0].start + calls[0].nbytes
    assert_one_error(result.code, result.err, 1, f"{source} changed while headprune read it (truncated to {cut} bytes")
    assert {k: v for k, v in snapshot(work).items() if k != "model.safetensors"} == before
    assert leftovers(work) == [] and not (work / "small.safetensors").exists()
