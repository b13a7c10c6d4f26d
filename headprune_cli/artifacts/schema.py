"""Versioned JSON artifacts (scores, plan, report), validated on read with pydantic.

Every artifact shares one envelope: kind, schema_version, headprune_version, created,
inputs [{role, path, sha256}], config (the resolved options), then its payload. Readers
refuse an unknown kind or version, non-finite numbers and out-of-range indices.
`created` honours SOURCE_DATE_EPOCH so that reruns can be byte-identical.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from headprune_cli import __version__
from headprune_cli.artifacts.neuron_scores import FFNScores
from headprune_cli.errors import ArtifactError, first_line
from headprune_cli.files.io import atomic_write_bytes, check_regular, sha256_bytes, sha256_file

SCHEMA_VERSION = 1
MAX_ARTIFACT_BYTES = 256 * 1024 * 1024


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class InputRef(Strict):
    role: str
    path: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Envelope(Strict):
    kind: str
    schema_version: int
    headprune_version: str
    created: str
    inputs: list[InputRef]
    config: dict[str, Any]


_INDEX = re.compile(r"0|[1-9][0-9]{0,8}")  # ASCII, no leading zeros: one spelling per index


def index_map(value: dict[str, Any]) -> dict[int, Any]:
    """String keys -> int indices; "00", "٣" or " 1" would alias or hide another key."""
    out = {}
    for key, item in value.items():
        if not isinstance(key, (str, int)) or isinstance(key, bool) or not _INDEX.fullmatch(str(key)):
            raise ValueError(f"index {str(key)[:20]!r} is not a non-negative integer in plain digits")
        if int(key) in out:
            raise ValueError(f"index {int(key)} is given twice")
        out[int(key)] = item
    return out


def _distinct(values: list[int], where: str) -> None:
    if len(set(values)) != len(values):
        raise ValueError(f"{where}: an index is listed twice")


class Scores(Envelope):
    """Importance of every kept head (original indices); higher = more important."""

    kind: Literal["scores"]
    method: str
    objective: str
    shape: tuple[int, int]  # [original layers, max original heads per layer]
    num_heads: list[int]  # original query heads per original layer
    num_kv_heads: list[int]
    kept: dict[int, list[int]]  # original layer -> original heads the scored model keeps
    heads: dict[int, dict[int, float]]  # original layer -> original head -> score
    layers: dict[int, float] | None = None  # original layer -> score, when asked
    # original layer -> loss change when all its heads are removed (with loss-scale layer
    # scores): what puts head scores on the layers' scale for joint selection
    attention: dict[int, float] | None = None
    samples: int
    cost: dict[str, Any]  # cost.CostTable as a dict
    ffn: FFNScores | None = None  # FFN neuron scores (`score --ffn`), compact: neuron_scores.py

    @field_validator("kept", "heads", "layers", "attention", mode="before")
    @classmethod
    def _maps(cls, value):
        return index_map(value) if isinstance(value, dict) else value

    @field_validator("heads", mode="before")
    @classmethod
    def _head_maps(cls, value):
        return (
            {k: index_map(v) if isinstance(v, dict) else v for k, v in value.items()}
            if isinstance(value, dict)
            else value
        )

    @model_validator(mode="after")
    def _consistent(self) -> Scores:
        layers, _ = self.shape
        if len(self.num_heads) != layers or len(self.num_kv_heads) != layers:
            raise ValueError("num_heads/num_kv_heads do not match shape")
        for q, kv in zip(self.num_heads, self.num_kv_heads):
            if kv < 1 or q < 1 or q % kv:
                raise ValueError(
                    f"a layer has {q} query and {kv} key/value heads; each needs at least 1, "
                    "and queries a multiple of key/values"
                )
        for layer, heads in self.kept.items():
            _distinct(heads, f"kept.{layer}")
        for layer, scored in self.heads.items():
            if layer not in self.kept or sorted(scored) != sorted(self.kept[layer]):
                raise ValueError(f"layer {layer}: scored heads differ from the heads the model keeps")
        for layer, heads in self.kept.items():
            if not 0 <= layer < layers or any(not 0 <= h < self.num_heads[layer] for h in heads):
                raise ValueError(f"layer {layer}: head index out of range")
        _ffn_matches_cost(self.ffn, self.cost)
        return self


def _ffn_matches_cost(ffn: FFNScores | None, cost: dict) -> None:
    """The neurons scored per layer are the neurons the scored model keeps, as its cost table
    (made from the model itself) counts them: scores claiming a wider layer would let a plan
    name neurons the model does not have."""
    if ffn is None:
        return
    widths = {
        entry.get("layer"): entry.get("ffn_width")
        for entry in cost.get("layers", [])
        if isinstance(entry, dict) and entry.get("ffn_width")
    }
    for layer, entry in ffn.layers.items():
        if widths.get(layer) != len(entry.kept_indices()):
            raise ValueError(
                f"ffn.layers.{layer}: {len(entry.kept_indices())} neurons scored, but the scored model keeps "
                f"{widths.get(layer, 'no')} FFN neurons in that layer (its cost table); score the model again"
            )


class Prediction(Strict):
    params: int
    flops_per_token: float


class Plan(Envelope):
    kind: Literal["plan"]
    strategy: str
    constraints: dict[str, Any]
    remove_heads: dict[int, list[int]]
    remove_layers: list[int]
    predicted: dict[Literal["before", "after"], Prediction]
    num_heads: list[int]
    search: dict[str, Any] | None = None  # `headprune search`: measured losses and evaluations
    latency: dict[str, Any] | None = None  # a latency budget (`select --latency`): target and predicted ms
    # FFN neurons to remove: original layer -> original neuron indices, strictly increasing
    # (one spelling per plan, checked in one pass even at 80 layers x 28,672 neurons). Absent
    # when the plan cuts no FFN, so plans without FFN cuts keep their bytes; `num_ffn` (the
    # original FFN width of every layer) comes with it and bounds the indices.
    remove_ffn: dict[int, list[int]] | None = None
    num_ffn: list[int] | None = None

    @field_validator("remove_heads", "remove_ffn", mode="before")
    @classmethod
    def _maps(cls, value):
        return index_map(value) if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _in_range(self) -> Plan:
        n = len(self.num_heads)
        for layer, heads in self.remove_heads.items():
            _distinct(heads, f"remove_heads.{layer}")
        _distinct(self.remove_layers, "remove_layers")
        for layer, heads in self.remove_heads.items():
            if not 0 <= layer < n or any(not 0 <= h < self.num_heads[layer] for h in heads):
                raise ValueError(f"layer {layer}: head index out of range")
        if any(not 0 <= layer < n for layer in self.remove_layers):
            raise ValueError("remove_layers: layer index out of range")
        _check_ffn(self.remove_ffn, self.num_ffn, n, set(self.remove_layers))
        return self


def _check_ffn(
    remove_ffn: dict[int, list[int]] | None, num_ffn: list[int] | None, layers: int, dropped: set[int]
) -> None:
    if remove_ffn is None:
        return
    if num_ffn is None or len(num_ffn) != layers or any(w < 1 for w in num_ffn):
        raise ValueError("remove_ffn needs num_ffn: the original FFN width of every layer")
    for layer, neurons in remove_ffn.items():
        if not 0 <= layer < layers:
            raise ValueError(f"remove_ffn: layer {layer} out of range")
        if layer in dropped:
            raise ValueError(f"remove_ffn.{layer}: the layer is also in remove_layers")
        if any(b <= a for a, b in zip(neurons, neurons[1:])):
            raise ValueError(f"remove_ffn.{layer}: neuron indices must be strictly increasing (sorted, none twice)")
        if neurons and not (neurons[0] >= 0 and neurons[-1] < num_ffn[layer]):
            raise ValueError(f"remove_ffn.{layer}: neuron index out of range (the layer has {num_ffn[layer]})")
        if len(neurons) == num_ffn[layer]:
            raise ValueError(f"remove_ffn.{layer}: removes every neuron; drop the layer instead")


def ffn_fields(remove_ffn: dict[int, list[int]], num_ffn: list[int]) -> dict:
    """The plan's FFN keys as a writer gives them: none when nothing is cut (the plan
    keeps the bytes it had), else sorted neurons per layer and the original widths."""
    cut = {int(k): sorted(v) for k, v in remove_ffn.items() if v}
    if not cut:
        return {}
    return {"remove_ffn": {str(k): cut[k] for k in sorted(cut)}, "num_ffn": list(num_ffn)}


# Every kind's payload model, as "module:Model": the module is imported the first time an
# artifact of that kind is read or checked, so reading a plan never imports the report's models
# and no stage has to be imported for its side effect. Size limits sit beside: kinds whose
# largest real artifact is far below MAX_ARTIFACT_BYTES (a latency table: a few dozen points
# per curve) are refused on their file size, before a byte is parsed.
KINDS: dict[str, str] = {
    "scores": "headprune_cli.artifacts.schema:Scores",
    "plan": "headprune_cli.artifacts.schema:Plan",
    "latency": "headprune_cli.stages.profile.latency_artifact:LatencyTableArtifact",
    "report": "headprune_cli.stages.report.report_artifact:Report",
    "sweep": "headprune_cli.stages.sweep.sweep_artifact:Sweep",
    "tasks": "headprune_cli.stages.tasks.tasks_artifact:TasksArtifact",
}
MAX_BYTES: dict[str, int] = {"latency": 4 * 1024 * 1024, "tasks": 64 * 1024 * 1024}


def model_of(kind: str) -> type[Envelope]:
    """The payload model of an artifact kind (KeyError for a kind not in KINDS)."""
    module, _, name = KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


# --- writing --------------------------------------------------------------------------
def created_now() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    moment = datetime.fromtimestamp(int(epoch), timezone.utc) if epoch else datetime.now(timezone.utc)
    return moment.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def input_ref(role: str, path: str | os.PathLike, sha256: str | None = None) -> dict:
    return {"role": role, "path": str(path), "sha256": sha256 or sha256_file(path)}


def envelope(kind: str, inputs: list[dict], config: dict) -> dict:
    return {
        "kind": kind,
        "schema_version": SCHEMA_VERSION,
        "headprune_version": __version__,
        "created": created_now(),
        "inputs": inputs,
        "config": config,
    }


def dumps(artifact: dict) -> str:
    _check_finite(artifact)
    return json.dumps(artifact, indent=2, allow_nan=False) + "\n"


def write_artifact(artifact: dict, output: str | os.PathLike | None) -> str:
    """Write to `output` atomically, or to stdout when it is None or '-'; returns sha256."""
    if output is None or str(output) == "-":
        text = dumps(artifact)
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        folder = Path(output).parent
        inputs = [{**ref, "path": portable_path(ref["path"], folder)} for ref in artifact.get("inputs", [])]
        text = dumps({**artifact, "inputs": inputs})
        atomic_write_bytes(output, text.encode())
    return sha256_bytes(text.encode())


def portable_path(path: str, folder: str | os.PathLike) -> str:
    """A reference as an artifact in `folder` stores it: relative to the folder when the file
    lies inside it (so an out folder gives the same bytes wherever it is, and moves whole),
    otherwise as the user gave it. Readers try a relative path beside the artifact first."""
    if path in ("-", "<stdin>") or not os.path.exists(path):
        return path
    real, base = os.path.realpath(path), os.path.realpath(folder)
    return os.path.relpath(real, base) if real.startswith(base.rstrip(os.sep) + os.sep) else path


def _check_finite(value: Any, where: str = "artifact") -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ArtifactError(f"{where} contains a non-finite number")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_finite(item, where)


# --- reading --------------------------------------------------------------------------
def read_text(source: str | os.PathLike, kinds: tuple[str, ...] = ()) -> tuple[str, str]:
    """Text and a display name of an artifact file, or of stdin for '-' (at most the size
    an artifact of `kinds` may have)."""
    limit = size_limit(kinds)
    if str(source) == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise ArtifactError("expected a JSON artifact on stdin (pipe one in, or give a path)")
        return sys.stdin.read(limit + 1), "<stdin>"
    path = Path(source)
    if not path.exists():
        raise ArtifactError(f"{path}: no such file")
    size = check_regular(path, "artifact", ArtifactError).st_size
    if size > limit:
        raise ArtifactError(_too_large(str(path), size, kinds))
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except UnicodeDecodeError:
        raise ArtifactError(f"{path}: not a text file") from None
    except PermissionError:
        raise ArtifactError(f"{path}: permission denied (not readable by this user)") from None


def size_limit(kinds: tuple[str, ...]) -> int:
    return max((MAX_BYTES.get(kind, MAX_ARTIFACT_BYTES) for kind in kinds), default=MAX_ARTIFACT_BYTES)


def _too_large(name: str, size: int, kinds: tuple[str, ...]) -> str:
    what = " or ".join(kinds) if kinds else "headprune"
    return f"{name}: too large to be a headprune {what} artifact ({size} bytes; at most {size_limit(kinds)})"


def parse_artifact(text: str, name: str, kinds: tuple[str, ...]) -> Envelope:
    """Parse and validate an artifact of one of `kinds`; only ArtifactError escapes."""
    if len(text) > size_limit(kinds):
        raise ArtifactError(_too_large(name, len(text), kinds))
    try:
        data = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicate_keys)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise ArtifactError(f"{name}: not valid JSON ({first_line(exc)})") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{name}: expected a JSON object")
    kind = data.get("kind")
    if kind not in kinds:
        raise ArtifactError(f"{name}: expected a {' or '.join(kinds)} artifact, got kind {kind!r}")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ArtifactError(
            f"{name}: {kind} schema_version {data.get('schema_version')!r} is not supported (need {SCHEMA_VERSION})"
        )
    try:
        return model_of(kind).model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "".join(f"{p}: " for p in [".".join(str(p) for p in first["loc"])] if p)
        message = str(first["msg"]).removeprefix("Value error, ")
        raise ArtifactError(f"{name}: invalid {kind}: {where}{message}") from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise ArtifactError(f"{name}: invalid {kind}: {first_line(exc)}") from None


def read_artifact(source: str | os.PathLike, kinds: tuple[str, ...]) -> tuple[Envelope, str]:
    """Read and validate; returns the artifact and the sha256 of its exact bytes."""
    text, name = read_text(source, kinds)
    return parse_artifact(text, name, kinds), sha256_bytes(text.encode())


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    """json.loads keeps the last of two equal keys silently; an artifact never has two."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"key {key[:20]!r} appears twice in one object")
            seen.add(key)
    return out


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed")
