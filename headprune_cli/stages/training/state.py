"""Training state on disk: safetensors for tensors, JSON for scalars, never pickle.

A state folder holds one sub-folder per saved step and a `latest.json` pointer that is
replaced atomically after the sub-folder is complete, so a kill at any moment leaves
either the previous state or the new one. Each step folder has:
  model.safetensors      the trainable weights (tied weights de-duplicated)
  optimizer.safetensors  AdamW moments per parameter index, and the RNG state
  best.safetensors       the best weights so far (only when an eval set is used)
  state.json             step, optimizer hyper-parameters, best metric, fingerprint
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from headprune_cli.errors import HeadpruneError, UsageError, shorten
from headprune_cli.files.io import atomic_write_bytes, os_error_in
from headprune_cli.files.outputs import make_folder

LATEST = "latest.json"


def save_state(
    folder: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, scalars: dict, best: dict | None
) -> None:
    """Write the state after `step` optimizer steps; older step folders are removed."""
    try:
        _save_state(folder, step, model, optimizer, scalars, best)
    except Exception as exc:
        error = os_error_in(exc)
        shutil.rmtree(folder / f".step-{step:08d}.tmp", ignore_errors=True)
        if error is None:
            raise
        raise HeadpruneError(f"could not save the training state in {folder}: {error.strerror or error}") from None


def _save_state(
    folder: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, scalars: dict, best: dict | None
) -> None:
    make_folder(folder)  # marked, so that finetune may delete it after success
    target = folder / f"step-{step:08d}"
    if target.exists():
        shutil.rmtree(target)
    tmp = folder / f".step-{step:08d}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        _write_step(tmp, step, model, optimizer, scalars, best)
        os.replace(tmp, target)
    except BaseException:  # a kill (SIGTERM/SIGINT) or a full disk leaves no half-written step
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_bytes(folder / LATEST, json.dumps({"step": step, "folder": target.name}).encode())
    for old in folder.glob("step-*"):
        if old.name != target.name:
            shutil.rmtree(old, ignore_errors=True)


def _write_step(
    tmp: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, scalars: dict, best: dict | None
) -> None:
    trainable = {name: p.detach().contiguous() for name, p in model.named_parameters() if p.requires_grad}
    if len(trainable) < len(list(model.parameters())):  # LoRA: the frozen rest is the input checkpoint
        save_file(trainable, str(tmp / "model.safetensors"))
    else:
        save_model(model, str(tmp / "model.safetensors"))
    tensors, groups = _optimizer_tensors(optimizer)
    tensors["rng.torch"] = torch.get_rng_state()
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    if best is not None:
        save_file({k: v.contiguous() for k, v in best.items()}, str(tmp / "best.safetensors"))
    state = {**scalars, "step": step, "param_groups": groups, "has_best": best is not None}
    (tmp / "state.json").write_text(json.dumps(state, sort_keys=True, indent=1))


def check_settings(state: dict, fingerprint: dict | None) -> None:
    """Refuse a state saved under other settings (LoRA or not, another rank, dtype, data...)
    before any of its tensors is read: they would not fit, or would train another run."""
    if fingerprint is None:
        return
    saved = state.get("fingerprint", {})
    changed = sorted(k for k in set(saved) | set(fingerprint) if saved.get(k) != fingerprint.get(k))
    if changed:
        raise UsageError(
            f"--resume: the saved training state used different settings ({', '.join(changed)}); "
            "start over without --resume"
        )


def load_state(
    folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, fingerprint: dict | None = None
) -> tuple[dict, dict | None]:
    """Restore weights, optimizer and RNG in place; returns (scalars, best weights or None)."""
    pointer = folder / LATEST
    if not pointer.is_file():
        raise UsageError(f"--resume: no training state in {folder} (nothing was saved yet)")
    try:
        name = json.loads(pointer.read_text())["folder"]
        if not isinstance(name, str) or not re.fullmatch(r"step-[0-9]{8}", name):
            raise ValueError(f"{LATEST} names {shorten(name)}, not a step folder of this state")
        target = folder / name
        state = _checked(json.loads((target / "state.json").read_text()))
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise UsageError(
            f"--resume: training state in {folder} is unreadable or tampered with ({shorten(str(exc), 160)})"
        ) from None
    check_settings(state, fingerprint)
    try:
        return state, _restore(target, state, model, optimizer)
    except UsageError:
        raise
    except Exception as exc:  # safetensors' and torch's own errors for corrupt or mismatched files
        raise UsageError(f"--resume: training state in {target} does not restore ({shorten(str(exc), 160)})") from None


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")
    epoch: StrictInt = Field(ge=0)
    step: StrictInt = Field(ge=0)
    train_loss: float | None
    metrics: dict[str, float]


class _State(BaseModel):
    """What a resume reads from state.json; anything else means the file was edited."""

    model_config = ConfigDict(extra="allow")
    step: StrictInt = Field(ge=1)
    param_groups: list[dict]
    has_best: StrictBool
    fingerprint: dict
    history: list[_Record]
    best_value: float | None
    best_epoch: StrictInt | None
    first_loss: float | None
    epoch_losses: list[float]


def _checked(state) -> dict:
    try:
        _State.model_validate(state)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"state.json: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    return state


def _restore(target: Path, state: dict, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
    missing, unexpected = load_model(model, str(target / "model.safetensors"), strict=False)
    if any(not p.requires_grad for p in model.parameters()):  # only the trainable weights were saved
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        missing = [name for name in missing if name in trainable]
    if missing or unexpected:
        raise UsageError(f"--resume: saved weights do not fit this model ({sorted([*missing, *unexpected])[0]})")
    tensors = load_file(str(target / "optimizer.safetensors"))
    torch.set_rng_state(tensors.pop("rng.torch"))
    optimizer.load_state_dict(_optimizer_dict(tensors, state["param_groups"]))
    return load_file(str(target / "best.safetensors")) if state.get("has_best") else None


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    raw = optimizer.state_dict()
    tensors = {}
    for index, slots in raw["state"].items():
        for key, value in slots.items():
            tensor = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"state.{index}.{key}"] = tensor.detach().cpu().contiguous()
    return tensors, raw["param_groups"]


def _optimizer_dict(tensors: dict[str, torch.Tensor], groups: list[dict]) -> dict:
    state: dict[int, dict] = {}
    for name, tensor in tensors.items():
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = tensor
    return {"state": state, "param_groups": groups}
