"""`finetune --lora` bad input: one `Error:` line, exit 2, and the folder exactly as it was."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support import assert_refused, snapshot

M, D, O = "model.safetensors", "data.jsonl", "o.safetensors"

# name -> (extra finetune options given the case's folder, a piece of the one error line)
CASES = {
    "rank 0": (
        lambda f: ["--lora", "--lora-rank", "0"],
        "Invalid value for '--lora-rank': Input should be greater than or equal to 1",
    ),  # the option's own bound
    "rank above the narrowest projection": (
        lambda f: ["--lora", "--lora-rank", "65"],
        "--lora-rank 65 is outside 1..64",
    ),
    "targets that match nothing": (
        lambda f: ["--lora", "--lora-targets", "q_proj,no_such_proj"],
        "--lora-targets no_such_proj matches none of the model's attention/FFN projections",
    ),
    "the encoder's classification head as a target": (
        lambda f: ["--lora", "--lora-targets", "classifier"],
        "--lora-targets classifier matches none",
    ),
    "--keep-adapter without --lora": (lambda f: ["--keep-adapter", f / "ad"], "--keep-adapter"),
    "LoRA settings without --lora": (lambda f: ["--lora-rank", "4"], "--lora-rank: LoRA settings need --lora"),
    # learned gates cut the model after training: an adapter of the uncut one would not fit it
    "--keep-adapter with learned gates": (
        lambda f: ["--lora", "--ratio", "0.25", "--keep-adapter", f / "ad"],
        "--keep-adapter: learn cuts the model after training; the adapter would not fit it",
        "learn",
    ),
    "--keep-adapter onto a user's folder": (
        lambda f: ["--lora", "--keep-adapter", f / "mine"],
        "holds files headprune did not write",
    ),
    "--lora-dropout 1": (lambda f: ["--lora", "--lora-dropout", "1"], "--lora-dropout 1.0 is outside [0, 1)"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_lora_bad_input_is_refused_and_writes_nothing(cli, base, tmp_path, name):
    folder = tmp_path / "case"
    folder.mkdir()
    for file in (M, D):
        shutil.copy(base / file, folder / file)
    (folder / "mine").mkdir()
    (folder / "mine" / "notes.txt").write_text("mine\n")
    before = snapshot(folder)
    extra, message, *command = CASES[name]
    res = cli(
        *(command or ["finetune"]),
        folder / M,
        "--data",
        folder / D,
        "--steps",
        "1",
        "-o",
        folder / O,
        *extra(Path(folder)),
    )
    assert_refused(res, 2, message)
    assert snapshot(folder) == before
    assert sorted(p.name for p in folder.iterdir()) == sorted([M, D, "mine"])
