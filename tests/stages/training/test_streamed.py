"""A streamed teacher: one block resident at a time, the same training as a loaded teacher."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from headprune_cli import save
from headprune_cli.errors import CheckpointError
from headprune_cli.model.checkpoint import load
from headprune_cli.model.surgery import apply_plan
from headprune_cli.runtime import recompute
from headprune_cli.stages.training import streamed, train
from headprune_cli.stages.training.distill import load_teacher
from headprune_cli.stages.training.lora import LoraSpec, attach
from headprune_cli.stages.training.train import FinetuneConfig, finetune
from tests.support import TINY


@pytest.fixture
def teacher_file(tmp_path):
    path = tmp_path / "teacher.safetensors"
    save(TINY["llama-gqa"](), path)
    return path


def _data(rows: int = 16) -> dict[str, torch.Tensor]:
    ids = torch.randint(2, 60, (rows, 8), generator=torch.Generator().manual_seed(3))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _student(lora: bool) -> torch.nn.Module:
    model = TINY["llama-gqa"]()
    apply_plan(model, {0: [0, 1, 2, 3]}, [])
    if lora:
        attach(model, LoraSpec(rank=2), seed=0)
    return model


def _block_tensors(model) -> list[torch.Tensor]:
    return [p for name, p in model.named_parameters() if ".layers." in name]


@pytest.mark.parametrize("lora", [True, False])
def test_streamed_teacher_trains_the_same_weights_as_a_loaded_one(teacher_file, lora):
    """KD and layer distillation against a streamed teacher give bit-identical weights."""
    cfg = FinetuneConfig(steps=3, lr=1e-2, batch_size=8, warmup=0, kd_weight=0.5, hidden_weight=1.0)
    results = []
    for stream in (False, True):
        student = _student(lora)
        teacher = load_teacher(teacher_file, student, streamed=stream)
        assert streamed.is_streamed(teacher) == stream
        out = finetune(student, _data(), cfg, teacher=teacher).model
        results.append({k: v.detach().clone() for k, v in out.state_dict().items()})
    assert results[0].keys() == results[1].keys()
    for name, value in results[0].items():
        assert torch.equal(results[1][name], value), name


def test_only_the_running_block_is_resident(teacher_file):
    teacher = load_teacher(teacher_file, _student(False), streamed=True)
    assert all(p.is_meta for p in _block_tensors(teacher))
    assert not teacher.get_input_embeddings().weight.is_meta  # outside the blocks: kept
    seen = []
    for block in teacher.model.layers:
        block.register_forward_pre_hook(lambda m, a: seen.append(sum(not p.is_meta for p in _block_tensors(teacher))))
    data = _data(2)
    with torch.no_grad():
        streamed_logits = teacher(**data).logits
        loaded_logits = load(teacher_file)(**data).logits
    # Each block's own tensors as it runs (pre-hooks run in registration order: the reading one first).
    assert seen == [len(list(block.parameters())) for block in teacher.model.layers]
    assert all(p.is_meta for p in _block_tensors(teacher))
    assert not any(p.requires_grad for p in teacher.parameters())
    assert torch.equal(streamed_logits, loaded_logits)


def test_place_casts_the_blocks_as_they_are_read(teacher_file):
    teacher = load_teacher(teacher_file, _student(False), streamed=True)
    streamed.place(teacher, torch.device("cpu"), torch.bfloat16)
    dtypes = []
    teacher.model.layers[0].register_forward_hook(lambda m, a, o: dtypes.append(m.mlp.up_proj.weight.dtype))
    with torch.no_grad():
        teacher(**_data(1))
    assert teacher.get_input_embeddings().weight.dtype == torch.bfloat16
    assert dtypes == [torch.bfloat16]


def test_a_block_with_nan_is_refused_when_first_read(teacher_file, tmp_path):
    tensors, meta = load_file(teacher_file), _metadata(teacher_file)
    name = next(k for k in tensors if k.endswith("layers.1.mlp.up_proj.weight"))
    tensors[name][0, 0] = float("nan")
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, bad, metadata=meta)
    teacher = load_teacher(bad, _student(False), streamed=True)  # the blocks are not read yet
    with pytest.raises(CheckpointError, match="NaN or inf"), torch.no_grad():
        teacher(**_data(1))


def _metadata(path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return f.metadata()


def test_training_recomputes_blocks_when_the_batch_outgrows_the_activation_budget(monkeypatch):
    """Recomputation turned on by the batch's size: the same weights as without it."""
    cfg = FinetuneConfig(steps=2, lr=1e-2, batch_size=8, warmup=0)
    runs = {}
    for floor in (1 << 40, 1):
        monkeypatch.setattr(recompute, "ACTIVATION_FLOOR", floor)
        used = []
        real = train.recomputed_blocks

        def spy(model, enabled, real=real, used=used):
            used.append(enabled)
            return real(model, enabled)

        monkeypatch.setattr(train, "recomputed_blocks", spy)
        out = finetune(_student(False), _data(), cfg).model
        runs[floor] = (set(used), {k: v.detach().clone() for k, v in out.state_dict().items()})
    assert runs[1 << 40][0] == {False} and runs[1][0] == {True}
    for name, value in runs[1 << 40][1].items():
        assert torch.equal(runs[1][1][name], value), name


@pytest.mark.parametrize("lora", [True, False])
def test_resident_tensors_are_the_frozen_students_own(teacher_file, lora):
    """A LoRA student's frozen embeddings serve the teacher too; a trained student's are not shared."""
    student = load(teacher_file)
    if lora:
        attach(student, LoraSpec(rank=2), seed=0)
    teacher = load_teacher(teacher_file, student, streamed=True)
    shared = teacher.get_input_embeddings().weight.data_ptr() == student.get_input_embeddings().weight.data_ptr()
    assert shared == lora
    assert torch.equal(teacher.get_input_embeddings().weight, student.get_input_embeddings().weight)
