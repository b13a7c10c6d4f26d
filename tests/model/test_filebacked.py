"""model/filebacked.py: a checkpoint loaded tensor by tensor holds no page it has not read,
and `release` gives back the pages a pass read, leaving written and replaced tensors alone."""

from __future__ import annotations

import torch

from headprune_cli import load, save
from headprune_cli.model import filebacked
from tests.support import TINY
from tests.support.resident import linux_only, resident_kib


def _loaded(tmp_path):
    save(TINY["llama"](), tmp_path / "m.safetensors")
    return load(tmp_path / "m.safetensors"), load(tmp_path / "m.safetensors", per_tensor=True)


def test_a_per_tensor_load_has_the_eager_loads_values(tmp_path):
    eager, lazy = _loaded(tmp_path)
    for (name, a), (_, b) in zip(eager.state_dict().items(), lazy.state_dict().items(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name


@linux_only
def test_pages_are_resident_once_read_and_leave_on_release(tmp_path):
    _, model = _loaded(tmp_path)
    weight = model.model.layers[0].mlp.up_proj.weight
    assert resident_kib(weight) == 0  # the load's NaN check read it, then it was mapped afresh
    before = weight.detach().clone()
    assert float(weight.detach().sum()) != 0.0
    assert resident_kib(weight) > 0
    assert filebacked.release(model.model.layers[0]) > 0
    assert resident_kib(weight) == 0
    assert torch.equal(weight, before)  # read again from the file


def test_release_leaves_written_and_replaced_tensors_alone(tmp_path):
    eager, model = _loaded(tmp_path)
    block = model.model.layers[0]
    written, replaced = block.self_attn.o_proj.weight, block.mlp.down_proj.weight
    with torch.no_grad():
        written.mul_(2)  # in place: the mapping stays, its values are no longer the file's
        replaced.data = replaced.data * 3  # a new tensor: not the file's mapping any more
    released = filebacked.release(block, keep=[written])
    want = eager.model.layers[0]
    assert torch.equal(written, want.self_attn.o_proj.weight * 2)
    assert torch.equal(replaced, want.mlp.down_proj.weight * 3)
    assert torch.equal(block.mlp.up_proj.weight, want.mlp.up_proj.weight)
    others = {id(t) for t in block.parameters()} - {id(written), id(replaced)}
    assert released == len(others)


def test_an_eager_load_is_never_released(tmp_path):
    eager, _ = _loaded(tmp_path)
    assert filebacked.release(eager) == 0
