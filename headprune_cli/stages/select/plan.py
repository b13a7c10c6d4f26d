"""Plan artifacts: a Selection wrapped with its inputs, and finding the model an
artifact belongs to (so that `headprune prune < plan.json` needs no model path).
"""

from __future__ import annotations

import os
from pathlib import Path

from headprune_cli.artifacts.schema import Envelope, Plan, envelope, ffn_fields, input_ref
from headprune_cli.errors import ArtifactError, CheckpointError, PlanError
from headprune_cli.files.io import check_regular, sha256_file
from headprune_cli.stages.constraints import Constraints
from headprune_cli.stages.select.chains import Selection


def selection_of(plan: dict) -> Selection:
    """A plan artifact (a dict) as the Selection it was made from."""
    return Selection(
        strategy=plan["strategy"],
        remove_heads={int(k): list(v) for k, v in plan["remove_heads"].items()},
        remove_layers=list(plan["remove_layers"]),
        predicted=plan.get("predicted"),
        remove_ffn={int(k): list(v) for k, v in (plan.get("remove_ffn") or {}).items()},
    )


def make_plan(
    selection: Selection,
    constraints: Constraints,
    scores,
    scores_path: str,
    scores_sha: str | None,  # None: hashed from scores_path
    config: dict,
    **extra,
) -> dict:
    """The plan artifact (a dict ready for schema.write_artifact) chosen from scores;
    `extra` adds optional payload (a latency budget's record)."""
    inputs = [input_ref("scores", scores_path, scores_sha)]
    model = model_ref(scores)
    found = [p for p in candidates(model.path, scores_path) if p.is_file()]  # as the scores' folder sees it
    inputs.append({"role": "model", "path": str(found[0]) if found else model.path, "sha256": model.sha256})
    num_ffn = list(scores.ffn.width) if getattr(scores, "ffn", None) is not None else None
    return plan_artifact(selection, constraints, inputs, list(scores.num_heads), config, num_ffn=num_ffn, **extra)


def plan_artifact(
    selection: Selection,
    constraints: Constraints,
    inputs: list[dict],
    num_heads: list[int],
    config: dict,
    num_ffn: list[int] | None = None,
    **extra,
) -> dict:
    """The plan artifact from its parts. `num_ffn` (the original FFN widths) when the plan
    may cut FFN neurons; `extra` adds optional payload (a search's record)."""
    plan = envelope("plan", inputs, config)
    plan.update(
        strategy=selection.strategy,
        constraints=constraints.to_dict(ffn=num_ffn is not None),
        remove_heads={str(k): v for k, v in sorted(selection.remove_heads.items())},
        remove_layers=sorted(selection.remove_layers),
        predicted=selection.predicted or {},
        num_heads=list(num_heads),
        **(ffn_fields(selection.remove_ffn, num_ffn) if num_ffn is not None else {}),
        **extra,
    )
    Plan.model_validate(plan)  # a plan we cannot read back must never be written
    return plan


def model_ref(artifact: Envelope):
    refs = [ref for ref in artifact.inputs if ref.role == "model"]
    if not refs:
        raise ArtifactError(f"the {artifact.kind} artifact names no model input; give the checkpoint path")
    return refs[0]


def find_model(artifact: Envelope, artifact_path: str | None, checkpoint: str | os.PathLike | None) -> Path:
    """The checkpoint to prune: the one given, or the one the artifact names (tried as
    given, then relative to the artifact's folder). check_model says whether it is the
    artifact's model."""
    ref = model_ref(artifact)
    if checkpoint is not None:
        path = Path(checkpoint)
        if not path.exists():
            raise CheckpointError(f"{path}: no such checkpoint file")
    else:
        found = [p for p in candidates(ref.path, artifact_path) if p.is_file()]
        if not found:
            where = (
                ""
                if _folder_of(artifact_path)
                else " in the current folder (an artifact on stdin has no folder of its own)"
            )
            raise CheckpointError(
                f"cannot find the model the artifact names ({ref.path}){where}; give the checkpoint path as an argument"
            )
        path = next((p for p in found if sha256_file(p) == ref.sha256), found[0]) if len(found) > 1 else found[0]
    check_regular(path, "checkpoint file", CheckpointError)  # before any byte is read: never /proc, a FIFO, a device
    return path


def check_model(artifact: Envelope, path: Path) -> None:
    """Refuse a checkpoint whose sha256 is not the one the artifact was made for."""
    ref = model_ref(artifact)
    digest = sha256_file(path)
    if digest != ref.sha256:
        raise PlanError(
            f"the {artifact.kind} was made for another model ({ref.path}, sha256 {ref.sha256[:12]}), "
            f"not {path} (sha256 {digest[:12]}); score and select on this model first"
        )


def candidates(named: str, artifact_path: str | None) -> list[Path]:
    """Where a path an artifact names may be: beside the artifact first (schema.portable_path
    stores files in the artifact's folder relative to it), then as given."""
    folder = _folder_of(artifact_path)
    if folder is not None and not Path(named).is_absolute():
        return [folder / named, Path(named)]
    return [Path(named)]


def _folder_of(artifact_path: str | None) -> Path | None:
    """The folder an artifact was read from; None when it came on stdin (or from nowhere)."""
    if not artifact_path or str(artifact_path) in ("-", "<stdin>"):
        return None
    return Path(artifact_path).parent
