"""Per-task forward and summed losses for training.

Training needs loss *sums* with their counts (rows, or next-token positions), not
means, so that micro-batches, gradient accumulation and data-parallel shards add up to
exactly the full-batch loss. objectives.py owns evaluation metrics; this module owns
the differentiable training terms.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from headprune_cli.data.readers import used_width
from headprune_cli.errors import DataError
from headprune_cli.model.layout import info_of
from headprune_cli.stages import lm_chunks, objectives
from headprune_cli.stages.training.distill import soft_kl


def predict(module: nn.Module, rows: dict[str, torch.Tensor], task: str, model: nn.Module) -> torch.Tensor:
    """Logits (classification [B, C], causal-lm [B, S, V]) or pooled embeddings [B, H].

    `module` is what is called (possibly a DDP wrapper), `model` the bare model that
    carries the headprune info (pooling) - objectives.embed with a wrapper allowed.
    """
    out = objectives.outputs_of(module, rows)
    return objectives.pool(model, out, rows["attention_mask"])


def task_loss(pred: torch.Tensor, rows: dict[str, torch.Tensor], task: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, count) of the task loss: cross-entropy per row, or per next token for LMs."""
    if task == "classification":
        return F.cross_entropy(pred.float(), rows["labels"], reduction="sum"), torch.tensor(float(len(pred)))
    if task == "causal-lm":
        nll, count = objectives.token_nll(pred, rows)
        return nll.sum(), count.sum()
    raise DataError(f"no task loss for {task!r} models; they are trained against a teacher")


def chunked_heads(model: nn.Module, teacher: nn.Module | None, rows: dict[str, torch.Tensor], alone: bool):
    """A context giving (student head, teacher head or None) with both models' heads off while a
    causal LM's batch is too large for whole logits (stages.lm_chunks), else None. `alone`: the
    student is called directly (no DDP/FSDP wrapper that owns the head's parameters)."""
    on = alone and lm_chunks.wants_chunks(model, rows)
    if not on or (teacher is not None and lm_chunks.head_name(teacher) is None):
        return nullcontext(None)
    return _heads_off(model, teacher)


@contextmanager
def _heads_off(model: nn.Module, teacher: nn.Module | None):
    with lm_chunks.head_off(model) as head:
        if teacher is None:
            yield head, None
            return
        with lm_chunks.head_off(teacher) as teacher_head:
            yield head, teacher_head


def chunked_task_loss(heads: tuple, hidden: torch.Tensor, rows: dict[str, torch.Tensor]) -> torch.Tensor:
    """task_loss's sum for a causal LM from its last hidden states, a chunk of tokens at a time."""
    return lm_chunks.chunked_nll(heads[0], hidden, rows)[0].sum()


def chunked_kd_loss(
    heads: tuple, hidden: torch.Tensor, teacher_hidden: torch.Tensor, rows: dict[str, torch.Tensor], temperature: float
) -> torch.Tensor:
    """distill.kd_logits's sum over next tokens from both models' last hidden states, in chunks."""
    mask = objectives.next_token_mask(rows)
    return lm_chunks.chunked_kd(heads[0], hidden, heads[1], teacher_hidden, temperature, mask, soft_kl)


def fidelity_loss(
    student: torch.Tensor, teacher: torch.Tensor, rows: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, count) of 1 - cosine to the teacher's embeddings: the fidelity objective."""
    per = 1.0 - objectives.cosine(student, teacher, rows["attention_mask"])
    return per.sum(), torch.tensor(float(len(per)))


def as_tensors(data) -> dict[str, torch.Tensor]:
    """A data.Dataset (or a dict of tensors) as the dict of row-aligned tensors training indexes."""
    if isinstance(data, dict):
        tensors = dict(data)
    else:
        names = ("input_ids", "attention_mask", "labels", "token_type_ids")
        tensors = {k: getattr(data, k) for k in names if getattr(data, k, None) is not None}
    if "attention_mask" not in tensors:
        tensors["attention_mask"] = torch.ones_like(tensors["input_ids"])
    return tensors


def trim(rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop trailing columns that are padding in every row (as data.as_batch does)."""
    width = used_width(rows["attention_mask"])
    return {k: (v[:, :width] if v.dim() == 2 else v) for k, v in rows.items()}


def check_labels(model: nn.Module, data: dict[str, torch.Tensor], name: str = "training data") -> None:
    """Classification data must carry labels the model has (0 <= label < num_labels)."""
    if info_of(model).task != "classification":
        return
    labels = data.get("labels")
    if labels is None:
        raise DataError(f"{name} has no labels; classification recovery needs a `label` per row")
    num = int(getattr(model.config, "num_labels", 0) or 0)
    bad = labels[(labels < 0) | (labels >= num)] if num else labels[:0]
    if len(bad):
        raise DataError(f"{name}: label {int(bad[0])} is not one the model knows (it has {num} labels: 0..{num - 1})")
