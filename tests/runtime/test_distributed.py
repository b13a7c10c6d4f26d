"""torchrun on a GPU node: one GPU per process, or one clear refusal before any group is joined."""

from __future__ import annotations

import pytest
import torch

from headprune_cli.errors import UsageError
from headprune_cli.runtime import distributed


def _torchrun_env(monkeypatch, processes: int, gpus: int) -> None:
    launched = {"WORLD_SIZE": processes, "RANK": 1, "LOCAL_RANK": 1, "LOCAL_WORLD_SIZE": processes}
    launched |= {"MASTER_ADDR": "localhost", "MASTER_PORT": 29500}  # torchrun sets the rendezvous too
    for name, value in launched.items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    joined = []
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda **kw: joined.append(kw))
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: bool(joined))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(distributed, "_joined", joined, raising=False)
    monkeypatch.setattr(distributed, "note_peers", lambda device: None)  # a collective of the faked group


def test_more_processes_than_gpus_is_refused_before_joining(monkeypatch):
    _torchrun_env(monkeypatch, processes=4, gpus=2)
    with pytest.raises(UsageError, match="4 processes on this node, which has 2 GPU.*--nproc-per-node 2"):
        distributed.setup()
    assert distributed._joined == []  # no process group was joined, so no peer waits on this one


@pytest.mark.parametrize("gpus, backend", [(2, "nccl"), (0, "gloo")])
def test_one_gpu_per_process_joins_with_nccl_and_no_gpu_with_gloo(monkeypatch, gpus, backend):
    _torchrun_env(monkeypatch, processes=2, gpus=gpus)
    ctx = distributed.setup()
    assert distributed._joined == [{"backend": backend}]
    assert ctx.world == 2 and ctx.rank == 1 and ctx.device.type == ("cuda" if gpus else "cpu")
