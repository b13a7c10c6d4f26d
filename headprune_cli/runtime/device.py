"""Where a stage computes and in which dtype: `--device`, `--dtype`, and placing a model.

- `--device auto|cpu|cuda|cuda:N`: auto is the first CUDA device (this process's
  LOCAL_RANK under torchrun) when torch sees one, else the CPU. The CPU stays the
  default on a machine without an accelerator.
- `--dtype auto|float32|bfloat16|float16`: the dtype the stage computes in. auto keeps
  the stored dtype. Only parameters are cast: buffers that transformers keeps in float32
  (RoPE `inv_freq`) stay float32. Stages that write a checkpoint cast back to the stored
  dtype before saving, so `--dtype` never changes what is on disk.
- A model larger than one accelerator: with `--device auto` and several visible CUDA
  devices, layers are spread over them with accelerate's device map (`dispatch_model`,
  whole blocks per device, the way transformers' `device_map="auto"` places them).
  That needs the `multi-gpu` extra (`pip install headprune[multi-gpu]`).

torch is imported inside the functions: `select`, `--help` and the config checks read the
option help from here without paying for torch.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headprune_cli.errors import UsageError
from headprune_cli.runtime.launch import env_int, launch

if TYPE_CHECKING:
    import torch
    from torch import nn

DEVICE_HELP = "auto (a CUDA device when there is one, else cpu), cpu, cuda or cuda:N."
DTYPE_HELP = (
    "Compute dtype: auto (the stored dtype), float32, bfloat16 or float16. What is saved keeps the stored dtype."
)
DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}
# Fraction of an accelerator's free memory the weights may take before layers are spread
# over several devices: activations, gradients of gates and the CUDA context need the rest.
FIT_FRACTION = 0.8


@dataclass(frozen=True)
class Placement:
    """What `place` did: where the inputs go, and the dtype to cast back to before saving."""

    device: torch.device
    stored_dtype: torch.dtype
    device_map: dict | None = None  # set when the layers were spread over several devices
    originals: dict | None = None  # parameter name -> its tensor as loaded (place(keep_originals=True))
    moved: bool = True  # False: the model already computed where and in the dtype asked; restore has nothing to do


def resolve_device(spec: str = "auto") -> torch.device:
    """The device that `--device SPEC` names, checked against what this machine has."""
    import torch  # noqa: PLC0415 (keeps torch out of this module's import)

    text = (spec or "auto").strip().lower()
    if text == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        text = "cuda"  # this process's device (LOCAL_RANK), checked below like --device cuda
    if text == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", text)
    if match is None:
        raise UsageError(f"--device {spec}: expected auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise UsageError(
            f"--device {spec}: this machine has no CUDA device that torch can use (use --device cpu or auto)"
        )
    local = env_int("LOCAL_RANK", 0)  # read only for a CUDA device: the CPU needs none
    index = int(match.group(1)) if match.group(1) is not None else local
    count = torch.cuda.device_count()
    if index >= count:
        # Under torchrun a rank past the GPU count would fail alone and leave the others
        # waiting in a collective: every rank refuses here instead.
        hint = (
            f"; torchrun started local rank {local}: use at most --nproc-per-node {count}, or --device cpu"
            if "LOCAL_RANK" in os.environ
            else ""
        )
        raise UsageError(f"--device {spec}: only {count} CUDA device(s) are visible (cuda:0 to cuda:{count - 1}){hint}")
    return torch.device("cuda", index)


def resolve_dtype(spec: str = "auto") -> torch.dtype | None:
    """The dtype `--dtype SPEC` names; None for auto (keep the stored dtype)."""
    import torch  # noqa: PLC0415 (keeps torch out of this module's import)

    text = (spec or "auto").strip().lower()
    if text == "auto":
        return None
    if text not in DTYPE_NAMES:
        raise UsageError(f"--dtype {spec}: expected auto, float32, bfloat16 or float16")
    return getattr(torch, DTYPE_NAMES[text])


def dtype_name(spec: str = "auto") -> str:
    """The canonical name of `--dtype SPEC` (bf16 -> bfloat16), 'auto' for auto."""
    dtype = resolve_dtype(spec)
    return "auto" if dtype is None else str(dtype).removeprefix("torch.")


def check(device: str = "auto", dtype: str = "auto") -> None:
    """Answer a bad --device/--dtype before any model or data is read."""
    resolve_device(device)
    resolve_dtype(dtype)


def stored_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's floating-point parameters (the first one's)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), next(model.parameters()).dtype)


def stored_dtype_name(model: nn.Module) -> str:
    """stored_dtype as artifacts write it: 'float32', 'bfloat16', ..."""
    return str(stored_dtype(model)).removeprefix("torch.")


def cast_parameters(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast floating-point parameters (not buffers) in place, keeping Parameter identity and ties."""
    for p in model.parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)


def place(model: nn.Module, device: str = "auto", dtype: str = "auto", keep_originals: bool = False) -> Placement:
    """Cast the model to the compute dtype and move it where it computes; see the module doc.

    `keep_originals` keeps the loaded parameter tensors (references: no copy unless the
    stage changes them) so that `restore` gives back, bit for bit, every weight the stage
    did not change, even when it computed in a narrower dtype."""
    target = resolve_device(device)
    compute = resolve_dtype(dtype)
    stored = stored_dtype(model)
    if not _moves(model, target, compute):
        # restore would compare every weight with itself (reading pages a stage may have given back)
        return Placement(target, stored, moved=False)
    originals = {name: p.data for name, p in model.named_parameters()} if keep_originals else None
    if compute is not None:
        cast_parameters(model, compute)
    if target.type == "cuda" and (device or "auto").strip().lower() == "auto" and not _fits(model, target):
        device_map = spread(model)
        return Placement(input_device(model), stored, device_map, originals)
    model.to(target)
    return Placement(target, stored, None, originals)


def _moves(model: nn.Module, target: torch.device, compute: torch.dtype | None) -> bool:
    """Whether placing `model` on `target` in `compute` changes anything: any parameter off the
    CPU, a target other than the CPU, or a floating-point parameter in another dtype."""
    if target.type != "cpu":
        return True
    return any(
        p.device.type != "cpu" or (compute is not None and p.is_floating_point() and p.dtype != compute)
        for p in model.parameters()
    )


def restore(model: nn.Module, placement: Placement) -> None:
    """Back on the CPU in the stored dtype: what `save` must write.

    A parameter the stage left unchanged gets its loaded tensor back (no round trip
    through the compute dtype); a changed one is cast to the stored dtype."""
    import torch  # noqa: PLC0415 (keeps torch out of this module's import)

    if not placement.moved:
        return
    if placement.device_map is not None:
        from accelerate.hooks import remove_hook_from_submodules  # noqa: PLC0415 (accelerate: an optional extra)

        remove_hook_from_submodules(model)
    model.to("cpu")
    originals = placement.originals or {}
    for name, p in model.named_parameters():
        original = originals.get(name)
        if original is not None and original.shape == p.shape and torch.equal(p.data, original.to(p.dtype)):
            p.data = original
        elif p.is_floating_point():
            p.data = p.data.to(placement.stored_dtype)


def input_device(model: nn.Module) -> torch.device:
    """Where a batch must be to enter the model: the device of its input embeddings."""
    embeddings = getattr(model, "get_input_embeddings", lambda: None)()
    for module in (embeddings, model):
        if module is not None:
            param = next(module.parameters(), None)
            if param is not None:
                return param.device
    import torch  # noqa: PLC0415 (keeps torch out of this module's import)

    return torch.device("cpu")


def model_bytes(model: nn.Module) -> int:
    seen, total = set(), 0
    for p in list(model.parameters()) + list(model.buffers()):
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


def _fits(model: nn.Module, device: torch.device) -> bool:
    import torch  # noqa: PLC0415 (keeps torch out of this module's import)

    if torch.cuda.device_count() < 2 or launch().world > 1:
        return True  # one device to use (alone, or this torchrun process's): an out-of-memory error says why
    free, _ = torch.cuda.mem_get_info(device)
    return model_bytes(model) <= FIT_FRACTION * free


def device_map_for(model: nn.Module, max_memory: dict) -> dict:
    """accelerate's layer placement for `max_memory` ({device: bytes}): whole blocks per device."""
    try:
        from accelerate import infer_auto_device_map  # noqa: PLC0415 (accelerate: an optional extra)
    except ImportError as exc:
        raise UsageError(
            "this model does not fit one accelerator; spreading it over several needs accelerate: "
            "pip install 'headprune[multi-gpu]'"
        ) from exc
    from headprune_cli.model.arch import adapter_for  # noqa: PLC0415 (keeps torch, transformers out of this module's import)

    blocks = adapter_for(model).layer_list(model)
    no_split = sorted({type(b).__name__ for b in blocks})
    return infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split)


def check_map(device_map: dict) -> dict:
    """Refuse a map that offloads to the CPU or disk: that is slower than computing on the CPU."""
    off = sorted({str(d) for d in device_map.values() if not isinstance(d, int)})
    if off:
        raise UsageError(
            f"the model does not fit the visible CUDA devices together (accelerate would offload to {', '.join(off)})"
        )
    return device_map


def spread(model: nn.Module) -> dict:
    """Place the model's layers over every visible CUDA device (accelerate dispatch_model)."""
    import torch  # noqa: PLC0415 (keeps torch out of this module's import)

    free = {i: int(FIT_FRACTION * torch.cuda.mem_get_info(i)[0]) for i in range(torch.cuda.device_count())}
    device_map = check_map(device_map_for(model, free))
    from accelerate import dispatch_model  # noqa: PLC0415 (keeps accelerate out of this module's import)

    dispatch_model(model, device_map=device_map)
    return device_map
