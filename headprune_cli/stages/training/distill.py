"""Knowledge distillation: choosing and checking a teacher, and the KD loss terms.

Losses are returned as (sum, count) pairs rather than means so that data-parallel
training can divide by the global count and match single-process training exactly.
  logits (classification, causal-lm): T^2 * KL(softmax(teacher/T) || softmax(student/T))
  embeddings (fidelity):              1 - cosine to the teacher's embeddings (task_losses)
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from headprune_cli.errors import UsageError
from headprune_cli.files.io import sha256_file
from headprune_cli.model.checkpoint import load, read_info
from headprune_cli.model.layout import info_of
from headprune_cli.stages.training.streamed import load_streamed


def resolve_teacher(spec: str | None, checkpoint: str | os.PathLike, root_teaches_itself: bool = False) -> Path | None:
    """The teacher file for `--teacher`: a path, or `auto` = the checkpoint's root model.
    With `root_teaches_itself` (learned pruning starts from the unpruned model), `auto` on
    a root model is the checkpoint itself."""
    if spec is None:
        return None
    if spec != "auto":
        return Path(spec)

    prov = read_info(checkpoint).provenance
    if not prov.get("root") and root_teaches_itself:
        return Path(checkpoint)
    if not prov.get("root"):
        raise UsageError(
            f"--teacher auto: {checkpoint} is a root model itself (no pruning history); pass --teacher PATH"
        )
    if not prov.get("root_path"):
        raise UsageError(f"--teacher auto: {checkpoint} does not record where its root model is; pass --teacher PATH")
    path = Path(checkpoint).parent / prov["root_path"]
    if not path.is_file():
        raise UsageError(
            f"--teacher auto: root model {path} (from {checkpoint}'s provenance) is missing; pass --teacher PATH"
        )
    if sha256_file(path) != prov["root"]:
        raise UsageError(f"--teacher auto: {path} is not the root model recorded in {checkpoint} (sha256 differs)")
    return path


def load_teacher(path: Path, student: nn.Module, streamed: bool = False) -> nn.Module:
    """Load a teacher and refuse one whose outputs cannot be compared with the student's.
    `streamed`: a causal LM's blocks are read from the file per forward (training/streamed.py)."""
    teacher = load_streamed(path, student) if streamed and read_info(path).task == "causal-lm" else load(path)
    check_compatible(teacher, student, str(path))
    teacher.eval()
    for param in teacher.parameters():
        param.requires_grad_(False)
    return teacher


def check_compatible(teacher: nn.Module, student: nn.Module, name: str = "teacher") -> None:
    t, s = info_of(teacher), info_of(student)
    if t.family != s.family:
        raise UsageError(f"teacher {name} is a {t.family} model, the student is {s.family}; KD needs the same family")
    if t.task != s.task:
        raise UsageError(f"teacher {name} is a {t.task} model, the student is {s.task}")
    if _vocab(t.config) != _vocab(s.config) or (t.tokenizer and s.tokenizer and t.tokenizer != s.tokenizer):
        raise UsageError(
            f"teacher {name} has a different vocabulary from the "
            f"student ({_vocab(t.config)} vs {_vocab(s.config)} tokens)"
        )
    if s.task == "classification" and _labels(t.config) != _labels(s.config):
        raise UsageError(f"teacher {name} predicts different labels from the student")


def _vocab(config: dict):
    return config.get("vocab_size")


def _labels(config: dict):
    id2label = config.get("id2label") or {}
    return config.get("num_labels", len(id2label) or None), {str(k): v for k, v in id2label.items()}


# --- loss terms ---------------------------------------------------------------------
def kd_logits(
    student: torch.Tensor, teacher: torch.Tensor, temperature: float, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum over rows (or unmasked tokens) of T^2 * KL(teacher || student), and their count."""
    per = _SoftKL.apply(student.float(), teacher.float().detach(), float(temperature))
    if mask is not None:
        per = per * mask
        return per.sum(), mask.sum()
    return per.sum(), torch.tensor(float(per.numel()))


def soft_kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 * KL(softmax(teacher/T) || softmax(student/T)) per row of float logits, analytic gradient."""
    return _SoftKL.apply(student, teacher, temperature)


class _SoftKL(torch.autograd.Function):
    """T^2 * KL(softmax(t/T) || softmax(s/T)) over the last axis, with the analytic gradient
    T * (softmax(s/T) - softmax(t/T)). Autograd's own gradient leaves rounding noise
    (the target probabilities do not sum to exactly 1) that Adam, being scale-free,
    would turn into real steps; this one is exactly zero when student == teacher."""

    @staticmethod
    def forward(ctx, student, teacher, t):
        log_s = F.log_softmax(student / t, dim=-1)
        log_t = F.log_softmax(teacher / t, dim=-1)
        ctx.save_for_backward(student, teacher)
        ctx.t = t
        return (log_t.exp() * (log_t - log_s)).sum(-1) * t * t

    @staticmethod
    def backward(ctx, grad):
        student, teacher = ctx.saved_tensors
        t = ctx.t
        diff = torch.softmax(student / t, dim=-1) - torch.softmax(teacher / t, dim=-1)
        return grad.unsqueeze(-1) * diff * t, None, None
