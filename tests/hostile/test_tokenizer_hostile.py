"""A tokenizer shipped in the user's checkpoint that gives up on the user's text is bad
input: one `Error:` line naming the file, the row and the tokenizer's reason (exit 1),
never exit 70, and no Rust panic text on stderr (the panic hook writes to descriptor 2,
so these tests capture descriptor 2, not only sys.stderr)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from headprune_cli.cli import main
from headprune_cli.data.tokenizer_guard import PROBES, TokenizerFailure, guarded
from tests.support import assert_one_error, finished, headprune, leftovers, snapshot

# Oniguruma backtracks without bound on these at 49 characters and gives up (retry-limit-in-match).
GIVES_UP_ON_PROBES = "(a|a?)+$"  # meets a probe: refused when the checkpoint's tokenizer is built
GIVES_UP_ON_A_ROW = "(z|z?)+$"  # no probe has a run of z: only the data row meets it


def with_pre_tokenizer(folder: Path, pattern: str, name: str) -> Path:
    """A copy of the checkpoint whose tokenizer.json splits on `pattern` (tensor bytes kept)."""
    raw = (folder / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    tokenizer = json.loads(header["__metadata__"]["headprune.tokenizer"])
    tokenizer["pre_tokenizer"] = {
        "type": "Split",
        "pattern": {"Regex": pattern},
        "behavior": "Isolated",
        "invert": False,
    }
    header["__metadata__"]["headprune.tokenizer"] = json.dumps(tokenizer)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (folder / name).write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length :])
    return folder / name


def data_with_row(folder: Path, text: str, at: int) -> Path:
    rows = (folder / "data.jsonl").read_text().splitlines()
    rows.insert(at - 1, json.dumps({"text": text, "label": 1}))
    (folder / "hostile.jsonl").write_text("\n".join(rows) + "\n")
    return folder / "hostile.jsonl"


def run_in_process(capfd, *args) -> tuple[int, str, str]:
    capfd.readouterr()
    code = main([str(a) for a in args])
    captured = capfd.readouterr()
    return code, captured.out, captured.err


CASES = {
    "score": lambda f, m, d: ["score", m, "--data", d, "--method", "random", "-o", f / "s.json"],
    "finetune": lambda f, m, d: ["finetune", m, "--data", d, "--steps", "1", "-o", f / "o.safetensors"],
    "report": lambda f, m, d: [
        "report",
        "--model",
        m,
        "--baseline",
        f / "model.safetensors",
        "--data",
        d,
        "--repeats",
        "0",
        "--json",
        f / "r.json",
    ],
}


@pytest.mark.parametrize("command", sorted(CASES))
def test_a_row_the_tokenizer_gives_up_on_is_refused_naming_file_row_and_reason(work, capfd, command):
    model = with_pre_tokenizer(work, GIVES_UP_ON_A_ROW, "hostile.safetensors")
    data = data_with_row(work, "z" * 48 + "b", at=3)
    before = snapshot(work)
    code, out, err = run_in_process(capfd, *CASES[command](work, model, data))
    assert_one_error(code, err, 1, f"{data}:3: the checkpoint's tokenizer failed on this row")
    assert "retry-limit-in-match" in err and out == ""
    assert snapshot(work) == before and leftovers(work) == []


def test_a_pattern_that_gives_up_on_the_probes_is_refused_before_the_data_is_read(work, capfd):
    model = with_pre_tokenizer(work, GIVES_UP_ON_PROBES, "hostile.safetensors")
    before = snapshot(work)
    code, out, err = run_in_process(capfd, "score", model, "--data", work / "data.jsonl", "-o", work / "s.json")
    assert_one_error(code, err, 1, f"{model}: its tokenizer gives up on a 49-character text")
    assert "retry-limit-in-match" in err and out == ""
    assert snapshot(work) == before and leftovers(work) == []


def test_the_installed_command_prints_one_line_and_no_panic(work):
    """The console entry point in its own process, with Rust's backtrace switched on."""
    model = with_pre_tokenizer(work, GIVES_UP_ON_A_ROW, "hostile.safetensors")
    data = data_with_row(work, "z" * 48 + "b", at=2)
    before = snapshot(work)
    process = headprune("score", model, "--data", data, "--method", "random", "-o", "s.json", cwd=work)
    code, out, err = finished(process)
    assert_one_error(code, err, 1, f"{data}:2: the checkpoint's tokenizer failed on this row (Onig")
    assert out == "" and snapshot(work) == before and leftovers(work) == []


def test_an_ordinary_tokenizer_passes_the_probes_and_reads_the_same_ids(work, capfd):
    """The demo tokenizer (whitespace split) meets no probe failure, and a tokenizer's
    harmless output on descriptor 2 is passed on, not swallowed."""
    code, _, err = run_in_process(
        capfd,
        "score",
        work / "model.safetensors",
        "--data",
        work / "data.jsonl",
        "--method",
        "random",
        "-o",
        work / "s.json",
    )
    assert code == 0, err
    assert len(PROBES) == 8 and all(len(p) == 49 for p in PROBES)

    def prints_then_returns():
        import os

        os.write(2, b"native note\n")
        return 7

    assert guarded(prints_then_returns) == 7
    assert capfd.readouterr().err == "native note\n"


def test_an_interrupt_inside_the_tokenizer_is_not_taken_for_its_failure():
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        guarded(interrupted)
    with pytest.raises(TokenizerFailure, match="bad"):
        guarded(lambda: (_ for _ in ()).throw(ValueError("bad")))
