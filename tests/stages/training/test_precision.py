"""`finetune --autocast`: bf16 forward passes, float32 weights and results."""

from __future__ import annotations

import pytest
import torch

from headprune_cli.errors import UsageError
from headprune_cli.stages.training.precision import autocast_dtype
from headprune_cli.stages.training.train import FinetuneConfig, finetune
from tests.support import TINY


def _data() -> dict[str, torch.Tensor]:
    ids = torch.randint(2, 60, (16, 8), generator=torch.Generator().manual_seed(4))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_default_is_off_on_cpu_and_a_device_without_bf16_is_refused():
    assert autocast_dtype(torch.device("cpu"), None) is None
    assert autocast_dtype(torch.device("cpu"), True) is torch.bfloat16
    assert autocast_dtype(torch.device("cpu"), False) is None
    with pytest.raises(UsageError, match="cannot compute in bfloat16"):
        autocast_dtype(torch.device("meta"), True)


def test_autocast_trains_in_bf16_and_keeps_float32_weights():
    runs = {}
    for autocast in (False, True):
        cfg = FinetuneConfig(steps=3, lr=1e-2, batch_size=8, warmup=0, autocast=autocast)
        runs[autocast] = finetune(TINY["llama-gqa"](), _data(), cfg)
    plain, cast = (dict(runs[k].model.state_dict()) for k in (False, True))
    assert all(v.dtype == torch.float32 for v in cast.values())
    # bf16 products round differently: the losses differ, but only by bf16 rounding.
    assert runs[True].first_loss != runs[False].first_loss
    assert runs[True].first_loss == pytest.approx(runs[False].first_loss, rel=2e-2)
    assert max(float((cast[k] - plain[k]).abs().max()) for k in plain) < 5e-2
