"""Build a model without allocating its weights, then give it the tensors of a file.

`build_empty` constructs the unpruned architecture with every parameter on the meta
device (no memory, no random initialisation) under the stored dtype as the default
dtype, exactly as transformers' `from_pretrained` does; buffers are computed for real
by the model's own constructor, so RoPE `inv_freq` stays in the float32 that
transformers gives it. Cutting to a pruned layout then costs nothing either, and `fill`
puts the file's tensors (memory-mapped, never copied) in place, tying shared weights
(GPT-2's lm_head and wte) explicitly. Everything the header says is checked before a
single weight is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from headprune_cli.errors import CheckpointError
from headprune_cli.model.tensorfile import Entry


@contextmanager
def params_on_meta() -> Iterator[None]:
    """Every parameter registered inside lands on the meta device; buffers stay real."""
    original = nn.Module.register_parameter

    def register(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(self, name, param)
        if param is not None and not param.is_meta:
            # Module constructors only allocate (torch.empty) before this; nothing is initialised yet.
            self._parameters[name] = type(param)(param.to("meta"), requires_grad=param.requires_grad)

    # patched on the class for this block only (restored in finally): mypy refuses assigning to a method
    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_empty(build: Callable[[], nn.Module], dtype: torch.dtype) -> nn.Module:
    """Run a model constructor with meta parameters under `dtype` (a float dtype)."""
    with default_dtype(dtype), params_on_meta():
        return build()


def stored_dtype(entries: dict[str, Entry]) -> torch.dtype:
    """The floating dtype holding most of the bytes: the dtype the model is built in."""
    sizes: dict[torch.dtype, int] = {}
    for entry in entries.values():
        if entry.dtype.is_floating_point:
            sizes[entry.dtype] = sizes.get(entry.dtype, 0) + entry.nbytes
    if not sizes:
        return torch.float32
    dtype = max(sizes, key=lambda d: (sizes[d], str(d)))
    if dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        raise CheckpointError(
            f"weights stored as {dtype} cannot be loaded (float32, float16, bfloat16 or float64 only)"
        )
    return dtype


def tied_groups(model: nn.Module) -> list[list[str]]:
    """State-dict names grouped by the tensor object they share (tied weights)."""
    groups: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), []).append(name)
    return sorted(sorted(names) for names in groups.values())


def check_entries(model: nn.Module, entries: dict[str, Entry], where) -> list[tuple[list[str], Entry]]:
    """Match the file's tensors to the model's slots by name, shape and dtype (header only)."""
    expected = model.state_dict(keep_vars=True)
    unknown = sorted(set(entries) - set(expected))
    if unknown:
        raise CheckpointError(f"{where}: unexpected tensor {unknown[0]!r} for {type(model).__name__}")
    plan = []
    for names in tied_groups(model):
        present = [n for n in names if n in entries]
        if not present:
            raise CheckpointError(f"{where}: tensor {names[0]!r} is missing")
        for name in present:
            want, got = expected[name], entries[name]
            if tuple(want.shape) != got.shape:
                raise CheckpointError(
                    f"{where}: tensor {name!r} has shape {list(got.shape)}, the layout needs {list(want.shape)}"
                )
            if want.dtype != got.dtype:
                raise CheckpointError(f"{where}: tensor {name!r} has dtype {got.dtype}, expected {want.dtype}")
        plan.append((names, entries[present[0]]))
    return plan


def fill(model: nn.Module, entries: dict[str, Entry], read: Callable[[Entry], torch.Tensor], where) -> None:
    """Give every parameter and persistent buffer its tensor from the file, tying shared ones."""
    for names, entry in check_entries(model, entries, where):
        tensor = read(entry)
        if not all_finite(tensor):
            raise CheckpointError(f"{where}: tensor {entry.name!r} contains NaN or inf")
        _place(model, names, tensor)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise CheckpointError(f"{where}: tensor {left[0]!r} is missing")


def all_finite(tensor: torch.Tensor) -> bool:
    """No NaN or inf. One min/max reduction: NaN propagates into both and an infinity is
    the min or the max, so both are finite only when every element is. It allocates no
    per-element temporary (an `isfinite` mask per tensor left +1.2 GB resident in malloc
    arenas on a 2.2 GB bf16 model) and runs ~20x faster than `isfinite` in small pieces."""
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return True
    if tensor.dtype.itemsize == 1:  # float8 has no CPU reductions: widen a piece at a time
        return all(all_finite(piece.float()) for piece in tensor.reshape(-1).split(1 << 20))
    low, high = tensor.aminmax()
    return bool(torch.isfinite(low) & torch.isfinite(high))


def _place(model: nn.Module, names: list[str], tensor: torch.Tensor) -> None:
    param = None
    for name in names:
        prefix, _, attr = name.rpartition(".")
        module = model.get_submodule(prefix)
        if attr in module._parameters:
            if param is None:
                existing = module._parameters[attr]
                assert existing is not None  # `names` come from the state dict, which lists no None parameter
                param = nn.Parameter(tensor, requires_grad=existing.requires_grad)
            module._parameters[attr] = param
        else:
            module._buffers[attr] = tensor
