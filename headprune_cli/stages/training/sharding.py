"""`finetune --fsdp`: FSDP2 under torchrun, one shard unit per block, then the root.

Data parallelism (DDP) keeps a full copy of the weights, gradients and AdamW moments in
every process; a 7-8 B model does not fit. `torch.distributed.fsdp.fully_shard` keeps 1/N
of each in each of N processes and gathers one block's weights at a time for its forward
and backward. The teacher is sharded the same way (it only runs forward passes).

The update equals one process's on the same global batch: the rows are split as under DDP
and FSDP's reduce-scatter averages the gradients as DDP's all-reduce does.

State on disk is sharded too (torch.distributed.checkpoint, each process writes its own
pieces), with the world size and the shard plan in state.json: resuming under another
world size or plan is refused with one line before anything is read. At the end the full
weights are gathered to rank 0's CPU memory and put into a plain (unsharded) copy of the
model loaded from its memory-mapped checkpoint, which rank 0 writes, once, atomically.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from headprune_cli.errors import HeadpruneError, UsageError, first_line, shorten
from headprune_cli.files.io import atomic_write_bytes, os_error_in
from headprune_cli.files.outputs import make_folder
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.layout import info_of

LATEST = "latest.json"


def check_fsdp(ctx, lora: bool) -> None:
    """--fsdp needs torchrun's processes and full-weight training."""
    if not ctx.active:
        raise UsageError("--fsdp shards over torchrun's processes; start it with torchrun --nproc-per-node N")
    if lora:
        raise UsageError("--fsdp trains every weight; --lora trains adapters in one process (drop one of them)")


def plan(model: nn.Module, world: int) -> dict:
    """What the sharded state depends on: the process count and the shard units."""
    return {"world": world, "units": len(adapter_for(model).layer_list(model)) + 1}


def shard(model: nn.Module, ctx) -> None:
    """fully_shard every block, then the root (embeddings, final norm, head), in place."""

    dtypes = {p.dtype for p in model.parameters()}
    if len(dtypes) > 1:  # one flat all-gather buffer per unit
        raise UsageError(f"--fsdp needs one parameter dtype; this model mixes {sorted(map(str, dtypes))}")
    mesh = init_device_mesh(ctx.device.type, (ctx.world,))
    for block in adapter_for(model).layer_list(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def gathered(model: nn.Module, ctx) -> nn.Module | None:
    """The full weights in a plain copy of the model, on rank 0 (None elsewhere).

    The copy is built with meta parameters from the checkpoint's header and takes the
    gathered tensors as they are (no second copy of the weights); buffers, which FSDP does
    not shard and which a state dict may leave out (RoPE's inv_freq), come from `model`."""

    from headprune_cli.model.checkpoint import read_layout_only  # noqa: PLC0415 (keeps numpy out of this module's import)

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not ctx.main:
        return None
    loaded_from = info_of(model).loaded_from
    if loaded_from is None:  # fsdp models are always read from a checkpoint file; say so rather than crash
        raise HeadpruneError("--fsdp: the model was not loaded from a checkpoint file, so it cannot be gathered")
    plain = read_layout_only(loaded_from[0])
    missing, unexpected = plain.load_state_dict(full, strict=False, assign=True)
    buffers = dict(model.named_buffers())
    if unexpected or [k for k in missing if k not in buffers]:
        raise HeadpruneError(f"gathered weights do not fit the model ({(missing + unexpected)[0]})")
    for name, buffer in buffers.items():
        owner, _, leaf = name.rpartition(".")
        setattr(plain.get_submodule(owner), leaf, buffer.detach().to("cpu", copy=True))
    plain.headprune = model.headprune
    plain.eval()
    return plain


# --- sharded training state -------------------------------------------------------------
def save_state(folder: Path, step: int, model, optimizer, scalars: dict, best: dict | None, ctx, layout: dict) -> None:
    """Every process writes its shards into a new step folder; rank 0 then points latest.json at it."""

    target, tmp = folder / f"step-{step:08d}", folder / f".step-{step:08d}.tmp"
    try:
        if ctx.main:
            make_folder(folder)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        dist.barrier()
        weights, moments = get_state_dict(model, optimizer)
        state = {"model": weights, "optimizer": moments, **({"best": best} if best is not None else {})}
        dcp.save(state, checkpoint_id=str(tmp))
        from safetensors.torch import save_file  # noqa: PLC0415 (only rank 0 writes)

        save_file({"rng.torch": torch.get_rng_state()}, str(tmp / f"rng-{ctx.rank}.safetensors"))
        dist.barrier()
        if ctx.main:
            meta = {**scalars, "step": step, "plan": layout, "has_best": best is not None, "files": shard_sizes(tmp)}
            (tmp / "state.json").write_text(json.dumps(meta, sort_keys=True, indent=1))
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
            atomic_write_bytes(folder / LATEST, json.dumps({"step": step, "folder": target.name}).encode())
            for old in folder.glob("step-*"):
                if old.name != target.name:
                    shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
    except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
        error = os_error_in(exc)
        if ctx.main:
            shutil.rmtree(tmp, ignore_errors=True)
        if error is None:
            raise
        raise HeadpruneError(f"could not save the training state in {folder}: {error.strerror or error}") from None


def read_state(folder: Path, layout: dict) -> tuple[Path, dict]:
    """The latest step folder and its scalars; refused when saved under another world size or plan."""
    pointer = folder / LATEST
    if not pointer.is_file():
        raise UsageError(f"--resume: no training state in {folder} (nothing was saved yet)")
    try:
        name = json.loads(pointer.read_text())["folder"]
        if not isinstance(name, str) or not name.startswith("step-") or not name[5:].isdigit():
            raise ValueError(f"{LATEST} names {shorten(str(name))}, not a step folder of this state")
        state = json.loads((folder / name / "state.json").read_text())
        saved = state["plan"]
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise UsageError(
            f"--resume: training state in {folder} is unreadable or not a sharded (--fsdp) state "
            f"({shorten(str(exc), 160)})"
        ) from None
    check_shards(folder / name, state.get("files"))
    if saved != layout:
        raise UsageError(
            f"--resume: the sharded state in {folder} was saved by {saved.get('world')} processes over "
            f"{saved.get('units')} shard units; this run has {layout['world']} over {layout['units']} "
            f"(resume with torchrun --nproc-per-node {saved.get('world')}, or start over without --resume)"
        )
    return folder / name, state


def read_state_agreed(folder: Path, layout: dict, ctx) -> tuple[Path, dict]:
    """read_state on every rank, and every rank refuses when one does: a rank that refused
    alone would leave torchrun to stop the others mid-load, with no word about why."""
    try:
        found, error = read_state(folder, layout), None
    except UsageError as exc:
        found, error = None, exc
    refused = int(ctx.sum(torch.tensor([0 if error is None else 1], device=ctx.device)).item())
    if error is not None:
        raise error
    if refused or found is None:
        raise UsageError(f"--resume: {refused} other process(es) refused the training state in {folder}")
    return found


def load_state(target: Path, state: dict, model, optimizer, ctx, best_like: dict | None) -> dict | None:
    """Restore this process's shards of weights and AdamW moments, its RNG, and the best weights."""
    from safetensors.torch import load_file  # noqa: PLC0415 (looked up when called: tests replace it)

    weights, moments = get_state_dict(model, optimizer)
    loaded: dict[str, Any] = {"model": weights, "optimizer": moments}  # dcp.load fills it in place
    if state.get("has_best"):
        loaded["best"] = best_like
    try:
        dcp.load(loaded, checkpoint_id=str(target))
        torch.set_rng_state(load_file(str(target / f"rng-{ctx.rank}.safetensors"))["rng.torch"])
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 (DCP's and safetensors' own errors for a corrupt or foreign state; DCP's is a BaseException)
        raise UsageError(f"--resume: training state in {target} does not restore ({_reason(exc)})") from None
    set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"])
    return loaded.get("best")


def shard_sizes(step_folder: Path) -> dict[str, int]:
    """Every file of a saved step (DCP's shards and metadata, the RNG states) with its size."""
    return {p.name: p.stat().st_size for p in sorted(step_folder.iterdir()) if p.is_file()}


def check_shards(step_folder: Path, sizes) -> None:
    """A shard missing or cut short is refused by name before DCP reads any (a state saved
    before sizes were recorded has none to check)."""
    if not isinstance(sizes, dict):
        return
    for name, size in sizes.items():
        path = step_folder / str(name)
        try:
            now = path.stat().st_size
        except OSError:
            raise UsageError(f"--resume: shard {path} of the training state is missing") from None
        if now != size:
            raise UsageError(
                f"--resume: shard {path} of the training state is corrupt ({now} bytes, saved as {size}); "
                "start over without --resume"
            )


def _reason(exc: BaseException) -> str:
    """The first failure DCP collected from its ranks (its own message only lists the ranks)."""
    if isinstance(exc, CheckpointException) and exc.failures:
        first = next(iter(exc.failures.values()))  # (exception, its stack summary)
        exc = first[0] if isinstance(first, tuple) else first
    return shorten(first_line(exc), 160)
