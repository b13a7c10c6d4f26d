"""Bad input across every command (CASES, then HOSTILE: files built to hurt).

Each case runs one `headprune` command in a fresh copy of a small workspace (the bundled
example model, its data, a scores and a plan artifact) and checks the bad-input
contract: one `Error: ...` line on stderr, the documented exit code (1 error, 2 usage), no
traceback, nothing on stdout, and every file in the folder exactly as it was. The checks
live in tests.support.assert_refused: a crash (exit 70, `Internal error: ...`) never passes a
case, even when its message happens to contain the case's fragment.
File safety, in its own block at the end: file-safety cases, where an output would destroy a file.
int8 ONNX (export --quantize, report --onnx), in a block after it: quantization cases.
Serving engines (export --vllm/--gguf, report --gguf, --runtime), in the last block: serving cases.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from headprune_cli import load, save
from headprune_cli.model.surgery import apply_plan
from tests.support import ROOT, TINY, assert_refused, snapshot

DEMO = ROOT / "examples" / "demo"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """model.safetensors, data files, scores.json and plan.json made by the real commands."""
    from headprune_cli.cli import main

    base = tmp_path_factory.mktemp("ws")
    shutil.copy(DEMO / "model.safetensors", base / "model.safetensors")
    rows = (DEMO / "dev.jsonl").read_text().splitlines()[:24]
    (base / "data.jsonl").write_text("\n".join(rows) + "\n")
    (base / "text.txt").write_text("\n".join(json.loads(r)["text"] for r in rows) + "\n")
    assert (
        main(
            [
                "score",
                str(base / "model.safetensors"),
                "--data",
                str(base / "data.jsonl"),
                "--method",
                "taylor",
                "-o",
                str(base / "scores.json"),
            ]
        )
        == 0
    )
    assert main(["select", str(base / "scores.json"), "--ratio", "0.25", "-o", str(base / "plan.json")]) == 0
    other = load(base / "model.safetensors")
    apply_plan(other, {0: [0]}, [])
    save(other, base / "other.safetensors")
    return base


@dataclass
class Case:
    name: str
    args: Callable[[Path], list]  # the command line, given the case's folder
    code: int
    message: str  # a piece of the one error line
    prepare: Callable[[Path], None] | None = None
    stdin: str | None = None


def _rewrite_tensors(folder: Path, change: Callable[[dict], None], name: str = "bad.safetensors") -> None:
    tensors = load_file(str(folder / "model.safetensors"))
    with open(folder / "model.safetensors", "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        metadata = json.loads(handle.read(length))["__metadata__"]
    change(tensors)
    save_file(tensors, str(folder / name), metadata=metadata)


def _first_tensor(tensors: dict) -> str:
    return sorted(k for k in tensors if k.endswith("weight"))[0]


def _edit_json(name: str, change: Callable[[dict], None], out: str = "edited.json") -> Callable[[Path], None]:
    def prepare(folder: Path) -> None:
        data = json.loads((folder / name).read_text())
        change(data)
        (folder / out).write_text(json.dumps(data))

    return prepare


def _write(name: str, content: str | bytes) -> Callable[[Path], None]:
    def prepare(folder: Path) -> None:
        path = folder / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)

    return prepare


def _latency(model: str = "model.safetensors", edit: Callable[[dict], None] | None = None) -> Callable[[Path], None]:
    """t.json: a hand-written latency table of `model` (edited.json: the same, edited)."""

    def prepare(folder: Path) -> None:
        from tests.support.latency import write_latency

        write_latency(folder / "t.json", load(folder / model), folder / model)
        if edit is not None:
            data = json.loads((folder / "t.json").read_text())
            edit(data)
            (folder / "edited.json").write_text(json.dumps(data))

    return prepare


def _backwards(data: dict) -> None:
    """Layer 0's attention: the fewest heads the slowest, far beyond the spread."""
    points = data["phases"]["forward"]["layers"]["0"]["attention"]
    points[0].update(median_ms=100.0, q1_ms=100.0, q3_ms=100.0)


def _nan_score(data: dict) -> None:
    layer = next(iter(data["heads"]))
    head = next(iter(data["heads"][layer]))
    data["heads"][layer][head] = float("nan")


def _corrupt_truncate(folder: Path) -> None:
    raw = (folder / "model.safetensors").read_bytes()
    (folder / "bad.safetensors").write_bytes(raw[: len(raw) - 1000])


def _search(*options: str) -> Callable[[Path], list]:
    """`search MODEL --data data.jsonl OPTIONS... -o p.json`."""
    return lambda f: ["search", f / M, "--data", f / "data.jsonl", *options, "-o", f / "p.json"]


def _iterate(*options: str) -> Callable[[Path], list]:
    """`iterate MODEL --data data.jsonl --eval-data data.jsonl --target-flops 0.6 --ffn OPTIONS... -o o.safetensors`."""
    data = lambda f: ["--data", f / "data.jsonl", "--eval-data", f / "data.jsonl"]  # noqa: E731
    return lambda f: ["iterate", f / M, *data(f), "--target-flops", "0.6", "--ffn", *options, "-o", f / O]


def _learn_gates(*target: str) -> Callable[[Path], list]:
    """`learn MODEL --data data.jsonl TARGET... --steps 1 -o o.safetensors`."""
    return lambda f: [
        "learn",
        f / M,
        "--data",
        f / "data.jsonl",
        *target,
        "--steps",
        "1",
        "-o",
        f / "o.safetensors",
    ]


M = "model.safetensors"
CASES = [
    # --- checkpoints -----------------------------------------------------------------------
    Case("truncated checkpoint", lambda f: ["inspect", f / "bad.safetensors"], 1, "truncated", _corrupt_truncate),
    Case(
        "corrupt bytes",
        lambda f: ["inspect", f / "bad.safetensors"],
        1,
        "corrupt safetensors",
        _write("bad.safetensors", b"\x00" * 64),
    ),
    Case(
        "empty checkpoint",
        lambda f: ["score", f / "bad.safetensors", "--data", f / "data.jsonl"],
        1,
        "too short",
        _write("bad.safetensors", b""),
    ),
    Case(
        "wrong dtype",
        lambda f: ["inspect", f / "bad.safetensors"],
        1,
        "dtype",
        lambda f: _rewrite_tensors(f, lambda t: t.update({_first_tensor(t): t[_first_tensor(t)].double()})),
    ),
    Case(
        "wrong shape",
        lambda f: ["inspect", f / "bad.safetensors"],
        1,
        "shape",
        lambda f: _rewrite_tensors(f, lambda t: t.update({_first_tensor(t): t[_first_tensor(t)][:1]})),
    ),
    Case(
        "missing tensor",
        lambda f: ["inspect", f / "bad.safetensors"],
        1,
        "missing",
        lambda f: _rewrite_tensors(f, lambda t: t.pop(_first_tensor(t))),
    ),
    Case(
        "NaN weight",
        lambda f: ["score", f / "bad.safetensors", "--data", f / "data.jsonl"],
        1,
        "NaN",
        lambda f: _rewrite_tensors(f, lambda t: t[_first_tensor(t)].fill_(float("nan"))),
    ),
    Case(
        "plain safetensors",
        lambda f: ["inspect", f / "bad.safetensors"],
        1,
        "without headprune metadata",
        lambda f: save_file({"w": torch.zeros(2)}, str(f / "bad.safetensors")),
    ),
    Case("checkpoint is a folder", lambda f: ["score", f, "--data", f / "data.jsonl"], 1, "a folder, not a checkpoint"),
    Case(
        "missing checkpoint",
        lambda f: ["prune", f / "nope.safetensors", "--plan", f / "plan.json", "-o", f / "o.safetensors"],
        1,
        "nope.safetensors",
    ),
    Case(
        "import folder without config",
        lambda f: ["import", f / "empty", "-o", f / "o.safetensors"],
        1,
        "no config.json",
        lambda f: (f / "empty").mkdir(),
    ),
    # --- JSON artifacts ----------------------------------------------------------------------
    Case(
        "plan where scores expected",
        lambda f: ["select", f / "plan.json", "--ratio", "0.5"],
        1,
        "expected a scores artifact",
    ),
    Case(
        "scores of a newer version",
        lambda f: ["select", f / "edited.json", "--ratio", "0.5"],
        1,
        "schema_version",
        _edit_json("scores.json", lambda d: d.update(schema_version=99)),
    ),
    Case(
        "NaN in scores",
        lambda f: ["select", f / "edited.json", "--ratio", "0.5"],
        1,
        "NaN",
        _edit_json("scores.json", _nan_score),
    ),
    Case(
        "scores not JSON",
        lambda f: ["select", f / "bad.json", "--ratio", "0.5"],
        1,
        "not valid JSON",
        _write("bad.json", "{not json"),
    ),
    Case("empty stdin", lambda f: ["select", "--ratio", "0.5"], 1, "not valid JSON", stdin=""),
    Case(
        "report JSON as plan",
        lambda f: ["prune", f / M, "--plan", f / "scores.json", "-o", f / "o.safetensors"],
        1,
        "expected a plan",
    ),
    Case(
        "plan for another model",
        lambda f: ["prune", f / "other.safetensors", "--plan", f / "plan.json", "-o", f / "o.safetensors"],
        1,
        "another model",
    ),
    Case(
        "plan head out of range",
        lambda f: ["prune", f / M, "--plan", f / "edited.json", "-o", f / "o.safetensors"],
        1,
        "out of range",
        _edit_json("plan.json", lambda d: d.update(remove_heads={"0": [99]})),
    ),
    Case(
        "plan empties a layer",
        lambda f: ["prune", f / M, "--plan", f / "edited.json", "-o", f / "o.safetensors"],
        1,
        "every head",
        _edit_json("plan.json", lambda d: d.update(remove_heads={"0": [0, 1, 2, 3]}, remove_layers=[])),
    ),
    Case(
        "scores head index not an int",
        lambda f: ["select", f / "edited.json", "--ratio", "0.5"],
        1,
        "invalid scores",
        _edit_json("scores.json", lambda d: d["heads"].update({"x": {}})),
    ),
    Case(
        "unknown artifact kind on stdin",
        lambda f: ["prune", f / M, "-o", f / "o.safetensors"],
        1,
        "kind",
        stdin='{"kind": "banana", "schema_version": 1}',
    ),
    Case(
        "scores for report of wrong kind",
        lambda f: [
            "report",
            "--model",
            f / M,
            "--baseline",
            f / M,
            "--data",
            f / "data.jsonl",
            "--scores",
            f / "plan.json",
        ],
        1,
        "scores",
    ),
    # --- options ---------------------------------------------------------------------------
    Case("ratio above 1", lambda f: ["select", f / "scores.json", "--ratio", "1.5"], 2, "ratio"),
    Case("ratio below 0", lambda f: ["select", f / "scores.json", "--ratio", "-0.1"], 2, "ratio"),
    Case(
        "min-heads above head count",
        lambda f: ["select", f / "scores.json", "--ratio", "0.5", "--min-heads", "9"],
        2,
        "min-heads",
    ),
    Case(
        "impossible multiple-of",
        lambda f: ["select", f / "scores.json", "--ratio", "0.5", "--multiple-of", "5"],
        2,
        "multiple-of",
    ),
    Case(
        "unknown strategy",
        lambda f: ["select", f / "scores.json", "--ratio", "0.5", "--strategy", "globl"],
        2,
        "did you mean",
    ),
    Case(
        "unknown method", lambda f: ["score", f / M, "--data", f / "data.jsonl", "--method", "taylr"], 2, "did you mean"
    ),
    Case("samples zero", lambda f: ["score", f / M, "--data", f / "data.jsonl", "--samples", "0"], 2, "samples"),
    Case("unknown option", lambda f: ["score", f / M, "--data", f / "data.jsonl", "--bogus"], 2, "No such option"),
    Case("missing required option", lambda f: ["prune", f / M, "--plan", f / "plan.json"], 2, "Missing option"),
    Case(
        "zero finetune steps",
        lambda f: ["finetune", f / M, "--data", f / "data.jsonl", "--steps", "0", "-o", f / "o.safetensors"],
        2,
        "steps",
    ),
    Case(
        "search with zero evaluations",
        _search("--ratio", "0.5", "--evaluations", "0"),
        2,
        "--evaluations",
    ),
    Case(
        "search with 10**9 evaluations",
        _search("--ratio", "0.5", "--evaluations", "1000000000"),
        2,
        "--evaluations",
    ),
    Case(
        "search for a budget heads cannot reach",
        _search("--target-flops", "0.01"),
        2,
        "cannot be met",
    ),
    Case(
        "rescored search for a budget layers cannot reach",
        _search("--target-flops", "0.01", "--rescore-layers"),
        2,
        "cannot be met",
    ),
    Case(
        "rescored search with FFN neurons",
        _search("--target-flops", "0.5", "--rescore-layers", "--ffn"),
        2,
        "heads only",
    ),
    Case(
        "rescored search by head ratio",
        _search("--ratio", "0.5", "--rescore-layers"),
        2,
        "--rescore-layers needs",
    ),
    Case(
        "search data too small to split",
        _search("--ratio", "0.5", "--samples", "3"),
        1,
        "too few to split",
    ),
    Case("learn-gates without a target", _learn_gates(), 2, "needs a target"),
    Case(
        "learn-gates tolerance out of range",
        _learn_gates("--ratio", "0.5", "--gate-tolerance", "1.5"),
        2,
        "--gate-tolerance",
    ),
    Case(
        "learn-gates target above what the closing can remove",
        _learn_gates("--ratio", "1.0"),
        2,
        "can remove at most",
    ),
    Case("learn-gates neuron gates on a head ratio", _learn_gates("--ratio", "0.5", "--gate-ffn"), 2, "not --ratio"),
    Case("learn-gates layer gates on a head ratio", _learn_gates("--ratio", "0.5", "--gate-layers"), 2, "not --ratio"),
    Case(
        "learn-gates FFN width rules without neuron gates",
        _learn_gates("--target-flops", "0.5", "--ffn-multiple-of", "4"),
        2,
        "need --gate-ffn",
    ),
    Case(
        "gate-ffn given to finetune",
        lambda f: ["finetune", f / M, "--data", f / "data.jsonl", "--gate-ffn", "--steps", "1", "-o", f / O],
        2,
        "--gate-ffn: moved to `headprune learn`",
    ),
    Case(
        "finetune --learn-gates, the old spelling of learn",
        lambda f: ["finetune", f / M, "--data", f / "data.jsonl", "--learn-gates", "--ratio", "0.5", "-o", f / O],
        2,
        "finetune --learn-gates: moved to `headprune learn` (see `headprune learn --help`)",
    ),
    Case("iterate unknown recovery", _iterate("--recover", "lsq"), 2, "unknown --recover 'lsq'"),
    Case("iterate lstsq with training options", _iterate("--recover", "lstsq", "--epochs", "2"), 2, "trains nothing"),
    Case("iterate calibration options without lstsq", _iterate("--samples", "64"), 2, "for --recover lstsq only"),
    Case(
        "negative gate",
        lambda f: ["report", "--model", f / M, "--baseline", f / M, "--data", f / "data.jsonl", "--max-drop", "-1"],
        2,
        "max-drop",
    ),
    Case("unknown command", lambda f: ["scroe"], 2, "No such command"),
    Case(
        "compensate without data",
        lambda f: ["prune", f / M, "--plan", f / "plan.json", "--compensate", "lstsq", "-o", f / "o.safetensors"],
        2,
        "--data",
    ),
    # --- data ------------------------------------------------------------------------------
    Case("empty data", lambda f: ["score", f / M, "--data", f / "empty.jsonl"], 1, "empty", _write("empty.jsonl", "")),
    Case(
        "malformed JSONL",
        lambda f: ["score", f / M, "--data", f / "bad.jsonl"],
        1,
        "bad.jsonl",
        _write("bad.jsonl", '{"text": "a b", "label": 0}\n{oops\n'),
    ),
    Case(
        "label out of range",
        lambda f: ["score", f / M, "--data", f / "bad.jsonl"],
        1,
        "label",
        _write("bad.jsonl", '{"text": "a X b Y c", "label": 17}\n'),
    ),
    Case(
        "missing label",
        lambda f: ["score", f / M, "--data", f / "text.txt", "--objective", "classification"],
        1,
        "label",
    ),
    Case(
        "unknown label name",
        lambda f: ["score", f / M, "--data", f / "bad.jsonl"],
        1,
        "label",
        _write("bad.jsonl", '{"text": "a X b Y c", "label": "zebra"}\n'),
    ),
    Case("missing data file", lambda f: ["score", f / M, "--data", f / "nope.jsonl"], 1, "nope.jsonl"),
    Case(
        "eval labels the model does not know",
        lambda f: [
            "finetune",
            f / M,
            "--data",
            f / "data.jsonl",
            "--eval-data",
            f / "bad.jsonl",
            "--steps",
            "1",
            "-o",
            f / "o.safetensors",
        ],
        1,
        "label",
        _write("bad.jsonl", '{"text": "a X b Y c", "label": 9}\n'),
    ),
    Case(
        "report on unlabelled data for a classifier",
        lambda f: ["report", "--model", f / M, "--baseline", f / M, "--data", f / "text.txt"],
        1,
        "label",
    ),
    # --- outputs ---------------------------------------------------------------------------
    Case(
        "output equals input",
        lambda f: ["prune", f / M, "--plan", f / "plan.json", "-o", f / M, "--force"],
        2,
        "also an input",
    ),
    Case(
        "output exists", lambda f: ["select", f / "scores.json", "--ratio", "0.5", "-o", f / "plan.json"], 2, "--force"
    ),
    Case(
        "output folder missing",
        lambda f: ["select", f / "scores.json", "--ratio", "0.5", "-o", f / "no" / "plan.json"],
        2,
        "does not exist",
    ),
    Case(
        "output under a file",
        lambda f: ["prune", f / M, "--plan", f / "plan.json", "-o", f / "data.jsonl" / "o.safetensors"],
        2,
        "does not exist",
    ),
    Case(
        "finetune output equals input",
        lambda f: ["finetune", f / M, "--data", f / "data.jsonl", "--steps", "1", "-o", f / M, "--force"],
        2,
        "also an input",
    ),
    Case("export onto existing file", lambda f: ["export", f / M, "--onnx", f / "data.jsonl"], 2, "--force"),
    # --- latency tables (select --latency, report --latency) ------------------------------------
    Case(
        "latency table for another model",
        lambda f: ["select", f / "scores.json", "--latency", f / "t.json", "--target-latency", "0.8"],
        2,
        "profiled on another model",
        _latency("other.safetensors"),
    ),
    Case(
        "latency table of another shape",
        lambda f: ["select", f / "scores.json", "--latency", f / "edited.json", "--target-latency", "0.8"],
        2,
        "profile this model",
        _latency(edit=lambda d: d["model"].update(num_heads=[h + 1 for h in d["model"]["num_heads"]])),
    ),
    Case(
        "latency table for another model in report",
        lambda f: [
            "report",
            "--model",
            f / "other.safetensors",
            "--baseline",
            f / "other.safetensors",
            "--data",
            f / "data.jsonl",
            "--repeats",
            "0",
            "--latency",
            f / "t.json",
        ],
        2,
        "profiled on another model",
        _latency(),
    ),
    Case(
        "non-monotone latency table",
        lambda f: ["select", f / "scores.json", "--latency", f / "edited.json", "--target-latency", "0.8"],
        1,
        "not monotone",
        _latency(edit=_backwards),
    ),
    Case(
        "non-finite latency table",
        lambda f: ["select", f / "scores.json", "--latency", f / "edited.json", "--target-latency", "0.8"],
        1,
        "Infinity",
        _latency(edit=lambda d: d["phases"]["forward"]["outside"].update(median_ms=float("inf"), q3_ms=float("inf"))),
    ),
    Case(
        "latency target below the table's reach",
        lambda f: ["select", f / "scores.json", "--latency", f / "t.json", "--target-latency", "0.01"],
        2,
        "below what the table can reach",
        _latency(),
    ),
    Case(
        "latency target beyond the constraints",
        lambda f: ["select", f / "scores.json", "--latency", f / "t.json", "--target-latency", "0.3"],
        2,
        "cannot be met",
        _latency(),
    ),
    Case(
        "latency table with a FLOPs target",
        lambda f: ["select", f / "scores.json", "--latency", f / "t.json", "--target-flops", "0.5"],
        2,
        "leave out --target-flops",
        _latency(),
    ),
    Case(
        "latency target without a table",
        lambda f: ["select", f / "scores.json", "--target-latency", "0.5"],
        2,
        "give --latency",
    ),
    Case(
        "latency target above 1",
        lambda f: ["select", f / "scores.json", "--latency", f / "t.json", "--target-latency", "1.5"],
        2,
        "outside (0, 1]",
        _latency(),
    ),
    Case(
        "decode prices from a table without decode",
        lambda f: [
            "select",
            f / "scores.json",
            "--latency",
            f / "t.json",
            "--target-latency",
            "0.8",
            "--latency-phase",
            "decode",
        ],
        2,
        "no decode profile",
        _latency(),
    ),
    Case(
        "profile decode of an encoder",
        lambda f: ["profile", f / M, "--context", "8", "-o", f / "t2.json"],
        2,
        "only causal LMs",
    ),
    # --- YAML --------------------------------------------------------------------------------
    Case("bad YAML", lambda f: ["run", f / "bad.yaml"], 2, "YAML", _write("bad.yaml", "stages: [score\n  - :")),
    Case(
        "YAML key typo",
        lambda f: ["run", f / "bad.yaml", "--out", f / "out"],
        2,
        "did you mean",
        lambda f: (f / "bad.yaml").write_text(
            f"model: {f / M}\ndata: {f / 'data.jsonl'}\nstages:\n  - command: score\n    methd: taylor\n"
        ),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, workspace: Path, tmp_path: Path, cli):
    run_case(case, workspace, tmp_path, cli)


def run_case(case: Case, workspace: Path, tmp_path: Path, cli):
    folder = tmp_path / "ws"
    shutil.copytree(workspace, folder)
    if case.prepare:
        case.prepare(folder)
    before = snapshot(folder)
    result = cli(*case.args(folder), stdin=case.stdin)
    assert_refused(result, case.code, case.message)
    assert snapshot(folder) == before
    return result


# --- hostile input: paths, header, data, YAML, artifacts ------------------------------------
def _meta(change: Callable[[dict], None], source: str = M, name: str = "bad.safetensors") -> Callable[[Path], None]:
    """A copy of a checkpoint with its headprune metadata (a dict of parsed JSON) edited."""

    def prepare(folder: Path) -> None:
        raw = (folder / source).read_bytes()
        length = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + length])
        meta = {k: json.loads(v) if k.split(".")[1] in _JSON_META else v for k, v in header["__metadata__"].items()}
        change(meta)
        header["__metadata__"] = {
            k: v if isinstance(v, RawJson) or k.split(".")[1] not in _JSON_META else json.dumps(v)
            for k, v in meta.items()
        }
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        (folder / name).write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + length :])

    return prepare


class RawJson(str):
    """Metadata text written as given (JSON that json.dumps would never produce)."""


_JSON_META = ("config", "layout", "provenance", "tokenizer_config", "pooling", "build_options")


def _layout(key: str, value) -> Callable[[dict], None]:
    return lambda m: m["headprune.layout"].update(
        {key: value(m["headprune.layout"][key]) if callable(value) else value}
    )


def _config(**values) -> Callable[[dict], None]:
    return lambda m: m["headprune.config"].update(values)


def _tensors(**tensors) -> Callable[[Path], None]:
    return lambda f: save_file(tensors, str(f / "bad.safetensors"))


def _yaml(body: str) -> Callable[[Path], None]:
    def prepare(folder: Path) -> None:
        (folder / "bad.yaml").write_text(f"model: {folder / M}\ndata: {folder / 'data.jsonl'}\n" + body)

    return prepare


def _fifo(name: str) -> Callable[[Path], None]:
    return lambda f: os.mkfifo(f / name)


def _hf_folder(**config) -> Callable[[Path], None]:
    def prepare(folder: Path) -> None:
        TINY["bert"]().save_pretrained(folder / "hf")
        data = json.loads((folder / "hf" / "config.json").read_text())
        (folder / "hf" / "config.json").write_text(json.dumps({**data, **config}))

    return prepare


PAGEMAP = "/proc/self/pagemap"  # a "regular" file that reads without end
O = "o.safetensors"
ids = torch.ones(3, 5, dtype=torch.long)
HOSTILE = [
    # --- layouts and configs checked before anything is built -----------------
    Case(
        "layout layer index a string",
        lambda f: ["inspect", f / "bad.safetensors"],
        1,
        "positive integers",
        _meta(_layout("layers", lambda v: [str(i) for i in v])),
    ),
    Case(
        "layout layer index a float",
        lambda f: ["score", f / "bad.safetensors", "--data", f / "data.jsonl"],
        1,
        "positive integers",
        _meta(_layout("layers", lambda v: [float(i) for i in v])),
    ),
    Case(
        "layout head count a string",
        lambda f: ["inspect", f / "bad.safetensors"],
        1,
        "positive integers",
        _meta(_layout("num_heads", lambda v: [str(i) for i in v])),
    ),
    Case(
        "layout kv head count 0",
        lambda f: ["inspect", f / "bad.safetensors"],
        1,
        "positive integers",
        _meta(_layout("num_kv_heads", lambda v: [0 for _ in v])),
    ),
    Case(
        "layout head index a float",
        lambda f: ["export", f / "bad.safetensors", "--hf", f / "exported"],
        1,
        "layout",
        _meta(_layout("heads", lambda v: [[float(h) for h in hs] for hs in v])),
    ),
    Case(
        "config declares 30000 layers",
        lambda f: ["inspect", f / "bad.safetensors"],
        1,
        "1 to 1024 layers",
        _meta(_config(heads_per_layer=[4] * 30000)),
    ),
    Case(
        "config hidden size negative",
        lambda f: ["inspect", f / "bad.safetensors"],
        1,
        "hidden_size=-64",
        _meta(_config(hidden_size=-64)),
    ),
    Case(
        "config vocab size a string",
        lambda f: ["report", "--model", f / "bad.safetensors", "--baseline", f / M, "--data", f / "data.jsonl"],
        1,
        "vocab_size",
        _meta(_config(vocab_size="64")),
    ),
    Case(
        "config with a 5000-digit integer",
        lambda f: ["inspect", f / "bad.safetensors"],
        1,
        "not valid JSON",
        _meta(
            lambda m: m.update(
                {
                    "headprune.config": RawJson(
                        json.dumps(m["headprune.config"]).replace('"vocab_size": 16', '"vocab_size": ' + "9" * 5000)
                    )
                }
            )
        ),
    ),
    Case(
        "config and layout disagree on heads",
        lambda f: ["inspect", f / "bad.safetensors"],
        1,
        "head counts differ",
        _meta(_config(heads_per_layer=[2, 2, 2, 2])),
    ),
    Case(
        "config MLP wider than its tensors",
        lambda f: ["score", f / "bad.safetensors", "--data", f / "data.jsonl"],
        1,
        "matches no stored tensor",
        _meta(_config(intermediate_size=400000)),
    ),
    Case(
        "config vocabulary of 2M over a 64-row table",
        lambda f: ["finetune", f / "bad.safetensors", "--data", f / "data.jsonl", "--steps", "1", "-o", f / O],
        1,
        "vocab_size=2000000",
        _meta(_config(vocab_size=2_000_000)),
    ),
    Case(
        "config position table differs",
        lambda f: ["sweep", f / "bad.safetensors", "--data", f / "data.jsonl", "--eval-data", f / "data.jsonl"],
        1,
        "position table",
        _meta(_config(max_position=1 << 20)),
    ),
    # --- paths from provenance and plans are regular files only -------------------
    Case(
        "baseline auto names /proc/self/pagemap",
        lambda f: ["report", "--model", f / "bad.safetensors", "--data", f / "data.jsonl"],
        1,
        "special filesystem",
        _meta(lambda m: m["headprune.provenance"].update(root_path=PAGEMAP), source="other.safetensors"),
    ),
    Case(
        "teacher auto names /proc/self/pagemap",
        lambda f: [
            "finetune",
            f / "bad.safetensors",
            "--data",
            f / "data.jsonl",
            "--teacher",
            "auto",
            "--steps",
            "1",
            "-o",
            f / O,
        ],
        1,
        "special filesystem",
        _meta(lambda m: m["headprune.provenance"].update(root_path=PAGEMAP), source="other.safetensors"),
    ),
    Case(
        "plan names /proc/self/pagemap as its model",
        lambda f: ["prune", "--plan", f / "edited.json", "-o", f / O],
        1,
        "special filesystem",
        _edit_json("plan.json", lambda d: [r.update(path=PAGEMAP) for r in d["inputs"] if r["role"] == "model"]),
    ),
    Case(
        "scores file is a FIFO", lambda f: ["select", f / "pipe.json", "--ratio", "0.5"], 1, "pipe", _fifo("pipe.json")
    ),
    Case("data file is a FIFO", lambda f: ["score", f / M, "--data", f / "pipe.jsonl"], 1, "pipe", _fifo("pipe.jsonl")),
    Case("data under /proc", lambda f: ["score", f / M, "--data", "/proc/self/status"], 1, "special filesystem"),
    Case(
        "data is a folder",
        lambda f: ["iterate", f / M, "--data", f / "texts", "--eval-data", f / "data.jsonl", "-o", f / O],
        1,
        "a folder",
        lambda f: (f / "texts").mkdir(),
    ),
    # --- data ---------------------------------------------------------------
    Case(
        "label a superscript digit",
        lambda f: ["score", f / M, "--data", f / "bad.jsonl"],
        1,
        "unknown label name",
        _write("bad.jsonl", '{"text": "a X b", "label": "\u00b2"}\n'),
    ),
    Case(
        "label 10**30",
        lambda f: ["score", f / M, "--data", f / "bad.jsonl"],
        1,
        "not a class index",
        _write("bad.jsonl", '{"text": "a X b", "label": 1000000000000000000000000000000}\n'),
    ),
    Case(
        "label 10**30 in a CSV",
        lambda f: ["finetune", f / M, "--data", f / "bad.csv", "--steps", "1", "-o", f / O],
        1,
        "unknown label name",
        _write("bad.csv", "text,label\na X b,1000000000000000000000000000000\n"),
    ),
    Case(
        "label a float",
        lambda f: ["report", "--model", f / M, "--baseline", f / M, "--data", f / "bad.jsonl"],
        1,
        "not an int",
        _write("bad.jsonl", '{"text": "a X b", "label": 1.5}\n'),
    ),
    Case(
        "label of 5000 digits",
        lambda f: ["score", f / M, "--data", f / "bad.jsonl"],
        1,
        "not valid JSON",
        _write("bad.jsonl", '{"text": "a X b", "label": ' + "9" * 5000 + "}\n"),
    ),
    Case(
        "data row nested 100000 deep",
        lambda f: ["score", f / M, "--data", f / "bad.jsonl"],
        1,
        "not valid JSON",
        _write("bad.jsonl", "[" * 100_000 + "]" * 100_000 + "\n"),
    ),
    Case(
        "tokenized set without columns",
        lambda f: ["score", f / M, "--data", f / "bad.safetensors"],
        1,
        "no columns",
        _tensors(input_ids=torch.zeros(3, 0, dtype=torch.long), labels=torch.zeros(3, dtype=torch.long)),
    ),
    Case(
        "tokenized set all padding",
        lambda f: ["score", f / M, "--data", f / "bad.safetensors"],
        1,
        "no tokens",
        _tensors(input_ids=ids, attention_mask=torch.zeros_like(ids), labels=torch.zeros(3, dtype=torch.long)),
    ),
    Case(
        "tokenized set mask of 2s",
        lambda f: ["score", f / M, "--data", f / "bad.safetensors"],
        1,
        "only 0 and 1",
        _tensors(input_ids=ids, attention_mask=2 * torch.ones_like(ids), labels=torch.zeros(3, dtype=torch.long)),
    ),
    # --- artifacts whose keys alias or repeat ---------------------------------
    Case(
        "scores keys 0 and 00",
        lambda f: ["select", f / "edited.json", "--ratio", "0.5"],
        1,
        "plain digits",
        _edit_json("scores.json", lambda d: d["heads"]["0"].update({"00": 9.0})),
    ),
    Case(
        "scores layer key in Arabic-Indic digits",
        lambda f: ["select", f / "edited.json", "--ratio", "0.5"],
        1,
        "plain digits",
        _edit_json("scores.json", lambda d: d["heads"].update({"\u0661": d["heads"].pop("1")})),
    ),
    Case(
        "scores with a duplicate JSON key",
        lambda f: ["select", f / "bad.json", "--ratio", "0.5"],
        1,
        "appears twice",
        lambda f: (f / "bad.json").write_text(
            (f / "scores.json").read_text().replace('"method"', '"method": "x", "method"', 1)
        ),
    ),
    Case(
        "scores num_kv_heads 0",
        lambda f: ["select", f / "edited.json", "--ratio", "0.5"],
        1,
        "key/value heads",
        _edit_json("scores.json", lambda d: d.update(num_kv_heads=[0] * len(d["num_kv_heads"]))),
    ),
    Case(
        "scores keep a head twice",
        lambda f: ["select", f / "edited.json", "--ratio", "0.5"],
        1,
        "listed twice",
        _edit_json("scores.json", lambda d: d["kept"]["0"].append(d["kept"]["0"][0])),
    ),
    Case(
        "plan lists a head twice",
        lambda f: ["prune", f / M, "--plan", f / "edited.json", "-o", f / O],
        1,
        "listed twice",
        _edit_json("plan.json", lambda d: d.update(remove_heads={"0": [1, 1]})),
    ),
    Case(
        "plan lists a layer twice",
        lambda f: ["prune", f / M, "--plan", f / "edited.json", "-o", f / O],
        1,
        "listed twice",
        _edit_json("plan.json", lambda d: d.update(remove_layers=[0, 0])),
    ),
    Case(
        "plan layer key 01",
        lambda f: ["prune", f / M, "--plan", f / "edited.json", "-o", f / O],
        1,
        "plain digits",
        _edit_json("plan.json", lambda d: d.update(remove_heads={"01": [1]})),
    ),
    # --- YAML, checked whole before any stage runs ---------------------------
    Case(
        "YAML alias bomb",
        lambda f: ["run", f / "bad.yaml", "--out", f / "out"],
        2,
        "aliases",
        _write(
            "bad.yaml",
            "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
            "model: *b\nstages: [{command: score}]\n",
        ),
    ),
    Case(
        "YAML duplicate key",
        lambda f: ["run", f / "bad.yaml", "--out", f / "out"],
        2,
        "appears twice",
        _yaml("stages:\n  - command: score\n    method: taylor\n    method: random\n"),
    ),
    Case(
        "YAML 5000-digit integer",
        lambda f: ["run", f / "bad.yaml", "--out", f / "out"],
        2,
        "digits",
        _yaml("seed: " + "7" * 5000 + "\nstages: [{command: score}]\n"),
    ),
    Case(
        "YAML protect names a folder",
        lambda f: ["run", f / "bad.yaml", "--out", f / "out"],
        2,
        "LAYER:HEAD",
        _yaml("stages:\n  - command: score\n  - command: select\n    ratio: 0.25\n    protect: /usr\n"),
    ),
    Case(
        "YAML NaN ratio",
        lambda f: ["run", f / "bad.yaml", "--out", f / "out"],
        2,
        "ratio",
        _yaml("stages:\n  - command: score\n  - command: select\n    ratio: .nan\n"),
    ),
    Case(
        "YAML unset variable in a stage",
        lambda f: ["run", f / "bad.yaml", "--out", f / "out"],
        2,
        "HEADPRUNE_SURELY_UNSET",
        _yaml("stages:\n  - command: score\n    method: ${HEADPRUNE_SURELY_UNSET}\n"),
    ),
    Case(
        "YAML unknown method in the first stage",
        lambda f: ["run", f / "bad.yaml", "--out", f / "out"],
        2,
        "did you mean",
        _yaml("stages:\n  - command: score\n    method: taylr\n"),
    ),
    Case(
        "YAML falling schedule",
        lambda f: ["run", f / "bad.yaml", "--out", f / "out"],
        2,
        "schedule",
        _yaml("stages:\n  - command: iterate\n    schedule: 0.5,0.2\n"),
    ),
    Case(
        "YAML rising FLOPs schedule",
        lambda f: ["run", f / "bad.yaml", "--out", f / "out"],
        2,
        "must fall",
        _yaml("stages:\n  - command: iterate\n    target_flops: 0.6,0.8\n"),
    ),
    Case(
        "YAML 100 KB value is quoted short",
        lambda f: ["run", f / "bad.yaml", "--out", f / "out"],
        2,
        "...",
        _yaml("stages:\n  - command: score\n    batch_size: " + "x" * 100_000 + "\n"),
    ),
    Case(
        "YAML data under /proc",
        lambda f: ["run", f / "bad.yaml", "--out", f / "out"],
        2,
        "special filesystem",
        lambda f: (f / "bad.yaml").write_text(
            f"model: {f / M}\ndata: /proc/self/status\nstages: [{{command: score}}]\n"
        ),
    ),
    Case(
        "run into a read-only folder",
        lambda f: ["run", f / "bad.yaml", "--out", "/proc/sys/headprune-out"],
        2,
        "not writable",
        _yaml("stages: [{command: score}]\n"),
    ),
    # --- import refuses what it could not read back -------------------------------------
    Case(
        "import negative head count",
        lambda f: ["import", f / "hf", "-o", f / O],
        1,
        "num_attention_heads=-4",
        _hf_folder(num_attention_heads=-4),
    ),
    Case(
        "import negative layer count",
        lambda f: ["import", f / "hf", "-o", f / O],
        1,
        "num_hidden_layers=-3",
        _hf_folder(num_hidden_layers=-3),
    ),
]


@pytest.mark.parametrize("case", HOSTILE, ids=[c.name for c in HOSTILE])
def test_hostile_input(case: Case, workspace: Path, tmp_path: Path, cli):
    """As test_bad_input, and the one line quotes at most a few hundred characters."""
    result = run_case(case, workspace, tmp_path, cli)
    assert len(result.err) < 600, result.err[:600]


def test_disk_full_leaves_nothing_behind(workspace: Path, tmp_path: Path, cli, monkeypatch):
    """ENOSPC in the middle of writing a checkpoint: one line, exit 1, no partial file."""
    import headprune_cli.model.checkpoint as checkpoint

    folder = tmp_path / "ws"
    shutil.copytree(workspace, folder)
    before = snapshot(folder)

    def full_disk(path, specs, metadata):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "write_file", full_disk)
    result = cli("prune", folder / M, "--plan", folder / "plan.json", "-o", folder / "small.safetensors")
    assert_refused(result, 1, "No space left on device")
    assert snapshot(folder) == before


# --- file safety: --force replaces earlier outputs, never inputs ---------------------------
# A separate block (and test) so that other cases can grow the list above independently.
# `other.safetensors` descends from `model.safetensors`: its provenance names it as parent
# and root, so `--teacher auto` and `--baseline auto` read it without it being named.
def _export_folder(folder: Path) -> None:
    from headprune_cli.model.formats.hf import export_hf

    export_hf(load(folder / M), folder / "exported")


def _dangling_link(folder: Path) -> None:
    (folder / "link.json").symlink_to(folder / "missing.json")


def _user_folder(folder: Path) -> None:
    (folder / "mine").mkdir()
    (folder / "mine" / "notes.txt").write_text("keep me")


def _run_config(stage: dict, out: str = "out", extra: dict | None = None) -> Callable[[Path], None]:
    def prepare(folder: Path) -> None:
        stages = [{"command": "score", "method": "random", **stage}] + ([extra] if extra else [])
        config = {
            "model": str(folder / M),
            "data": str(folder / "data.jsonl"),
            "out": str(folder / out),
            "stages": stages,
        }
        (folder / "run.yaml").write_text(json.dumps(config))  # JSON is YAML

    return prepare


FT = ["--data", "data.jsonl", "--steps", "1"]
SAFETY_CASES = [
    # a state folder is deleted after training, so it must be one headprune made
    Case(
        "finetune --state-dir the working folder",
        lambda f: ["finetune", f / M, *_in(f, FT), "-o", f / "o.safetensors", "--state-dir", f],
        2,
        "contains the input",
    ),
    Case(
        "finetune --state-dir a user's folder",
        lambda f: ["finetune", f / M, *_in(f, FT), "-o", f / "o.safetensors", "--state-dir", f / "mine"],
        2,
        "did not write",
        _user_folder,
    ),
    Case(
        "finetune --state-dir holding the output",
        lambda f: ["finetune", f / M, *_in(f, FT), "-o", f / "st" / "o.safetensors", "--state-dir", f / "st"],
        2,
        "overlap",
        lambda f: (f / "st").mkdir(),
    ),
    # inputs reached through provenance, and inside an input folder
    Case(
        "finetune --teacher auto onto the root",
        lambda f: ["finetune", f / "other.safetensors", *_in(f, FT), "--teacher", "auto", "-o", f / M, "--force"],
        2,
        "also an input",
    ),
    Case(
        "iterate -o its teacher",
        lambda f: [
            "iterate",
            f / M,
            "--data",
            f / "data.jsonl",
            "--eval-data",
            f / "data.jsonl",
            "--teacher",
            f / "other.safetensors",
            "-o",
            f / "other.safetensors",
            "--force",
        ],
        2,
        "also an input",
    ),
    Case(
        "report --json onto the auto baseline",
        lambda f: [
            "report",
            "--model",
            f / "other.safetensors",
            "--data",
            f / "data.jsonl",
            "--json",
            f / M,
            "--force",
        ],
        2,
        "also an input",
    ),
    Case(
        "report --markdown onto the auto baseline",
        lambda f: [
            "report",
            "--model",
            f / "other.safetensors",
            "--data",
            f / "data.jsonl",
            "--markdown",
            f / M,
            "--force",
        ],
        2,
        "also an input",
    ),
    Case(
        "import -o inside the input folder",
        lambda f: ["import", f / "exported", "-o", f / "exported" / "model.safetensors", "--force"],
        2,
        "inside the input folder",
        _export_folder,
    ),
    Case(
        "select -o the model its scores name",
        lambda f: ["select", f / "scores.json", "--ratio", "0.5", "-o", f / M, "--force"],
        2,
        "also an input",
    ),
    Case(
        "prune -o the scores its plan names",
        lambda f: ["prune", f / M, "--plan", f / "plan.json", "-o", f / "scores.json", "--force"],
        2,
        "also an input",
    ),
    Case(
        "score -o the parent checkpoint",
        lambda f: ["score", f / "other.safetensors", "--data", f / "data.jsonl", "-o", f / M, "--force"],
        2,
        "also an input",
    ),
    Case(
        "output through a symlink to an input",
        lambda f: ["select", f / "scores.json", "--ratio", "0.5", "-o", f / "alias.json", "--force"],
        2,
        "also an input",
        lambda f: (f / "alias.json").symlink_to(f / "scores.json"),
    ),
    # folder outputs: never fill or replace a folder headprune did not make
    Case(
        "dangling symlink output without --force",
        lambda f: ["select", f / "scores.json", "--ratio", "0.5", "-o", f / "link.json"],
        2,
        "symlink",
        _dangling_link,
    ),
    Case(
        "report --plot a user's folder",
        lambda f: [
            "report",
            "--model",
            f / "other.safetensors",
            "--data",
            f / "data.jsonl",
            "--plot",
            f / "mine",
            "--force",
        ],
        2,
        "did not write",
        _user_folder,
    ),
    Case(
        "sweep -o the working folder",
        lambda f: [
            "sweep",
            f / M,
            "--data",
            f / "data.jsonl",
            "--eval-data",
            f / "data.jsonl",
            "--methods",
            "random",
            "--ratios",
            "0.5",
            "-o",
            f,
            "--force",
        ],
        2,
        "contains the input",
    ),
    Case(
        "export --hf a user's folder",
        lambda f: ["export", f / M, "--hf", f / "mine", "--force"],
        2,
        "did not write",
        _user_folder,
    ),
    # a run writes only inside its out folder, and never into a user's folder
    Case(
        "run stage name ../escaped",
        lambda f: ["run", f / "run.yaml"],
        2,
        "plain file name",
        _run_config({"name": "../escaped"}),
    ),
    Case(
        "run stage name an absolute path",
        lambda f: ["run", f / "run.yaml"],
        2,
        "plain file name",
        lambda f: _run_config({"name": str(f / "abs")})(f),
    ),
    Case(
        "run stage name run-state",
        lambda f: ["run", f / "run.yaml"],
        2,
        "not a file of its own",
        _run_config({"name": "run-state"}),
    ),
    Case(
        "run --force into the working folder",
        lambda f: ["run", f / "run.yaml", "--force"],
        2,
        "contains the input",
        _run_config({}, out="."),
    ),
    Case(
        "run --force into a user's folder",
        lambda f: ["run", f / "run.yaml", "--force"],
        2,
        "did not write",
        lambda f: (_user_folder(f), _run_config({}, out="mine")(f)),
    ),
    Case(
        "iterate --recover lstsq onto its data",
        lambda f: [*_iterate("--recover", "lstsq")(f)[:-1], f / "data.jsonl", "--force"],
        2,
        "also an input",
    ),
    Case(
        "learned neuron gates' scores onto the checkpoint",
        lambda f: [*_learn_gates("--target-flops", "0.5", "--gate-ffn")(f), "--gates-out", f / M, "--force"],
        2,
        "also an input",
    ),
    Case(
        "run stage names that write one file",
        lambda f: ["run", f / "run.yaml"],
        2,
        "as stage",
        _run_config({}, extra={"command": "select", "name": "scores", "ratio": 0.5}),
    ),
]


def _in(folder: Path, args: list[str]) -> list:
    """Relative data names in an argument list, made paths inside the case's folder."""
    return [folder / a if a.endswith(".jsonl") else a for a in args]


@pytest.mark.parametrize("case", SAFETY_CASES, ids=[c.name for c in SAFETY_CASES])
def test_file_safety_bad_input(case: Case, workspace: Path, tmp_path: Path, cli):
    test_bad_input(case, workspace, tmp_path, cli)


# --- int8 ONNX (export --quantize, report --onnx) -------------------------------------------
# A block of its own, as the file-safety block, so that the lists above grow independently.
def _calib_of_another_vocabulary(folder: Path) -> None:
    ids = torch.full((4, 6), 10**6, dtype=torch.long)  # far beyond the demo model's vocabulary
    save_file({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, str(folder / "calib.safetensors"))


def _onnx_of(source_sha: str) -> Callable[[Path], None]:
    """A tiny valid ONNX file whose metadata names `source_sha` as the checkpoint it came from."""

    def prepare(folder: Path) -> None:
        import onnx
        from onnx import TensorProto, helper

        node = helper.make_node("Identity", ["x"], ["y"])
        graph = helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        proto.metadata_props.add(key="headprune.source_sha256", value=source_sha)
        onnx.save_model(proto, str(folder / "shipped.onnx"))

    return prepare


def _report_onnx(extra: Callable[[Path], list]) -> Callable[[Path], list]:
    return lambda f: ["report", "--model", f / M, "--baseline", f / M, "--data", f / "data.jsonl", *extra(f)]


QUANTIZE_CASES = [
    Case(
        "unknown quantization",
        lambda f: ["export", f / M, "--onnx", f / "q.onnx", "--quantize", "int4"],
        2,
        "unknown --quantize 'int4'",
    ),
    Case(
        "quantize without --onnx",
        lambda f: ["export", f / M, "--hf", f / "out", "--quantize", "int8-dynamic"],
        2,
        "--quantize goes with --onnx",
    ),
    Case(
        "static quantization without calibration data",
        lambda f: ["export", f / M, "--onnx", f / "q.onnx", "--quantize", "int8-static"],
        2,
        "needs --calib-data",
    ),
    Case(
        "calibration data for dynamic quantization",
        lambda f: [
            "export",
            f / M,
            "--onnx",
            f / "q.onnx",
            "--quantize",
            "int8-dynamic",
            "--calib-data",
            f / "text.txt",
        ],
        2,
        "int8-dynamic needs no data",
    ),
    Case(
        "calibration data that does not match the model",
        lambda f: [
            "export",
            f / M,
            "--onnx",
            f / "q.onnx",
            "--quantize",
            "int8-static",
            "--calib-data",
            f / "calib.safetensors",
        ],
        1,
        "token ids must lie in",
        _calib_of_another_vocabulary,
    ),
    Case("report --onnx of a missing file", _report_onnx(lambda f: ["--onnx", f / "none.onnx"]), 2, "no such file"),
    Case(
        "report --onnx of a file that is not ONNX",
        _report_onnx(lambda f: ["--onnx", f / "text.txt"]),
        1,
        "not an ONNX file",
    ),
    Case(
        "report --onnx of another checkpoint's export",
        _report_onnx(lambda f: ["--onnx", f / "shipped.onnx"]),
        1,
        "not from --model",
        _onnx_of("0" * 64),
    ),
    Case(
        "report --onnx on a GPU",
        _report_onnx(lambda f: ["--onnx", f / "shipped.onnx", "--device", "cuda"]),
        2,
        "--device cuda does not go with it",
        _onnx_of("0" * 64),
    ),
]


@pytest.mark.parametrize("case", QUANTIZE_CASES, ids=[c.name for c in QUANTIZE_CASES])
def test_quantize_bad_input(case: Case, workspace: Path, tmp_path: Path, cli):
    test_bad_input(case, workspace, tmp_path, cli)


# --- serving engines (export --vllm/--gguf, report --gguf, --runtime) -----------------------
def _uneven_llama(folder: Path) -> None:
    """A LLaMA cut whose layers keep different query-head counts: llama.cpp loads it, vLLM cannot."""
    from tests.support.gguf_models import write_checkpoint
    from tests.support.vllm_models import UNEVEN_QUERY, tiny_llama32

    write_checkpoint(folder / "uneven.safetensors", UNEVEN_QUERY, tiny_llama32())


def _llama(folder: Path, name: str = "lm.safetensors") -> None:
    """A tiny LLaMA causal LM that both --vllm and --gguf write."""
    from tests.support.gguf_models import write_checkpoint

    write_checkpoint(folder / name)


def _llama_and_gguf(folder: Path) -> None:
    """The LLaMA, and a file that starts like a GGUF file (all the checks before llama.cpp read)."""
    _llama(folder)
    (folder / "lm.gguf").write_bytes(b"GGUF" + bytes(60))


def _report_gguf(extra: Callable[[Path], list] = lambda f: [], gguf: str = "lm.gguf") -> Callable[[Path], list]:
    """report --gguf FILE of the LLaMA on text."""
    return lambda f: [
        "report",
        "--model",
        f / "lm.safetensors",
        "--baseline",
        f / "lm.safetensors",
        "--data",
        f / "text.txt",
        *extra(f),
        "--gguf",
        f / gguf,
    ]


def _weighted_gguf(out: str, calib: str, kind: str = "q4_0") -> Callable[[Path], list]:
    """export --gguf OUT of the LLaMA at `kind`, weighed by the calibration text CALIB."""
    return lambda f: ["export", f / "lm.safetensors", "--gguf", f / out, "--gguf-type", kind, "--calib-data", f / calib]


SERVING_CASES = [
    Case(
        "export --vllm of an encoder",
        lambda f: ["export", f / M, "--vllm", f / "served"],
        1,
        "--vllm writes LLaMA-family causal LMs",
    ),
    Case(
        "export --vllm of a cut nemotron-nas cannot state",
        lambda f: ["export", f / "uneven.safetensors", "--vllm", f / "served"],
        1,
        "layer 1 keeps 8 query heads where layer 0 keeps 4",
        _uneven_llama,
    ),
    Case(
        "export --vllm and --hf together",
        lambda f: ["export", f / M, "--vllm", f / "served", "--hf", f / "out"],
        2,
        "give exactly one of",
    ),
    Case(
        "export --vllm onto an existing folder",
        lambda f: ["export", f / "uneven.safetensors", "--vllm", f / "kept"],
        2,
        "--force",
        lambda f: (_uneven_llama(f), (f / "kept").mkdir()),
    ),
    Case(
        "export --vllm onto its own checkpoint",
        lambda f: ["export", f / "lm.safetensors", "--vllm", f / "lm.safetensors", "--force"],
        2,
        "is also an input",
        _llama,
    ),
    Case(
        "export --vllm into the folder that holds its checkpoint",
        lambda f: ["export", f / "lm" / "lm.safetensors", "--vllm", f / "lm", "--force"],
        2,
        "contains the input",
        lambda f: (f / "lm").mkdir() or _llama(f, "lm/lm.safetensors"),
    ),
    Case(
        "export --vllm into a user's folder",
        lambda f: ["export", f / "lm.safetensors", "--vllm", f / "mine", "--force"],
        2,
        "--vllm folder",
        lambda f: (_llama(f), _user_folder(f)),
    ),
    Case(
        "export --gguf onto its own checkpoint",
        lambda f: ["export", f / "lm.safetensors", "--gguf", f / "lm.safetensors", "--force"],
        2,
        "is also an input",
        _llama,
    ),
    Case(
        "export --gguf onto a user's folder",
        lambda f: ["export", f / "lm.safetensors", "--gguf", f / "mine", "--force"],
        2,
        "is a directory, not a file",
        lambda f: (_llama(f), _user_folder(f)),
    ),
    Case(
        "export --gguf onto a user's file",
        lambda f: ["export", f / "lm.safetensors", "--gguf", f / "mine" / "notes.txt"],
        2,
        "pass --force",
        lambda f: (_llama(f), _user_folder(f)),
    ),
    Case(
        "export --gguf q4_0 weighted onto its calibration text",
        lambda f: [*_weighted_gguf("text.txt", "text.txt")(f), "--force"],
        2,
        "is also an input",
        _llama,
    ),
    Case(
        "export --gguf --calib-data with a type it does not weigh",
        _weighted_gguf("x.gguf", "text.txt", "q8_0"),
        2,
        "--calib-data with --gguf goes with --gguf-type q4_0",
        _llama,
    ),
    Case(
        "export --gguf --calib-data of a missing file",
        _weighted_gguf("x.gguf", "absent.txt"),
        1,
        "absent.txt: no such data file",
        _llama,
    ),
    Case(
        "export --gguf --calib-data of an empty text",
        _weighted_gguf("x.gguf", "empty.txt"),
        1,
        "empty.txt: no examples",
        lambda f: (_llama(f), (f / "empty.txt").write_text("")),
    ),
    Case(
        "export --gguf with --quantize",
        lambda f: ["export", f / "lm.safetensors", "--gguf", f / "x.gguf", "--quantize", "int8-dynamic"],
        2,
        "--quantize goes with --onnx FILE",
        _llama,
    ),
    Case(
        "export --gguf-rounding gptq without --calib-data",
        lambda f: [
            "export",
            f / "lm.safetensors",
            "--gguf",
            f / "x.gguf",
            "--gguf-type",
            "q4_0",
            "--gguf-rounding",
            "gptq",
        ],
        2,
        "--gguf-rounding gptq goes with --gguf FILE --calib-data TEXT",
        _llama,
    ),
    Case(
        "export --gguf of an unknown rounding",
        lambda f: [*_weighted_gguf("x.gguf", "text.txt")(f), "--gguf-rounding", "stochastic"],
        2,
        "--gguf-rounding: one of nearest, gptq (got stochastic)",
        _llama,
    ),
    Case(
        "export --gguf-rounding gptq of a type it does not round",
        lambda f: [*_weighted_gguf("x.gguf", "text.txt", "q8_0")(f), "--gguf-rounding", "gptq"],
        2,
        "--calib-data with --gguf goes with --gguf-type q4_0",
        _llama,
    ),
    Case(
        "export --vllm with --calib-data",
        lambda f: ["export", f / "lm.safetensors", "--vllm", f / "served", "--calib-data", f / "text.txt"],
        2,
        "--calib-data goes with --onnx FILE --quantize int8-static or --gguf FILE",
        _llama,
    ),
    Case(
        "export --gguf of an unknown type",
        lambda f: ["export", f / "lm.safetensors", "--gguf", f / "x.gguf", "--gguf-type", "q4_k"],
        2,
        "supported: auto, f32, f16, bf16, q8_0",
        _llama,
    ),
    Case(
        "export --gguf with an embedding type llama.cpp's k-quant mixes alone choose",
        lambda f: ["export", f / "lm.safetensors", "--gguf", f / "x.gguf", "--gguf-embedding-type", "q4_K_M"],
        2,
        "unknown --gguf-embedding-type 'q4_K_M'; supported: f32, f16, bf16, q8_0",
        _llama,
    ),
    Case(
        "export --gguf-embedding-type without --gguf",
        lambda f: ["export", f / "lm.safetensors", "--hf", f / "out", "--gguf-embedding-type", "q8_0"],
        2,
        "--gguf-embedding-type goes with --gguf FILE",
        _llama,
    ),
    Case(
        "export --gguf of a family llama.cpp has no architecture for",
        lambda f: ["export", f / "gpt2.safetensors", "--gguf", f / "x.gguf"],
        1,
        "LLaMA-family causal LMs (llama, mistral",
        lambda f: save(TINY["gpt2"](), f / "gpt2.safetensors"),
    ),
    Case(
        "report --gguf with --onnx",
        _report_gguf(lambda f: ["--onnx", f / "lm.gguf"]),
        2,
        "--gguf and --onnx each name the shipped file",
        _llama_and_gguf,
    ),
    Case(
        "report --gguf on a GPU",
        _report_gguf(lambda f: ["--device", "cuda"]),
        2,
        "--device cuda does not go with it",
        _llama_and_gguf,
    ),
    Case(
        "report --gguf of a file that is not GGUF",
        _report_gguf(gguf="text.txt"),
        1,
        "not a GGUF file",
        _llama_and_gguf,
    ),
    Case(
        "report --gguf of an encoder",
        lambda f: [
            "report",
            "--model",
            f / M,
            "--baseline",
            f / M,
            "--data",
            f / "data.jsonl",
            "--gguf",
            f / "lm.gguf",
        ],
        2,
        "--gguf evaluates causal LMs",
        _llama_and_gguf,
    ),
    Case(
        "report --gguf without llama.cpp's environment",
        _report_gguf(lambda f: ["--engine-python", f / "no-env" / "bin" / "python"]),
        2,
        "engine environment absent",
        _llama_and_gguf,
    ),
    Case(
        "select for an unknown runtime",
        lambda f: ["select", f / "scores.json", "--ratio", "0.3", "--runtime", "tgi", "-o", f / "p.json"],
        2,
        "unknown --runtime 'tgi'",
    ),
    Case(
        "search for a runtime with one head count",
        _search("--ratio", "0.5", "--runtime", "vllm"),
        2,
        "search does not take --runtime vllm",
    ),
]


@pytest.mark.parametrize("case", SERVING_CASES, ids=[c.name for c in SERVING_CASES])
def test_serving_bad_input(case: Case, workspace: Path, tmp_path: Path, cli):
    test_bad_input(case, workspace, tmp_path, cli)
