"""Per-task forward and summed losses for training.

Training needs loss *sums* with their counts (rows, or next-token positions), not
means, so that micro-batches, gradient accumulation and data-parallel shards add up to
exactly the full-batch loss. objectives.py owns evaluation metrics; this module owns
the differentiable training terms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .errors import DataError
from .layout import info_of

_MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def predict(module: nn.Module, rows: dict[str, torch.Tensor], task: str, model: nn.Module) -> torch.Tensor:
    """Logits (classification [B, C], causal-lm [B, S, V]) or pooled embeddings [B, H].

    `module` is what is called (possibly a DDP wrapper), `model` the bare model that
    carries the headprune info.
    """
    out = module(**{k: v for k, v in rows.items() if k in _MODEL_INPUTS})
    if task != "embedding":
        return out.logits
    return pool(out.last_hidden_state, rows.get("attention_mask"), info_of(model).pooling)


def pool(hidden: torch.Tensor, mask: torch.Tensor | None, pooling: dict) -> torch.Tensor:
    """Sentence embedding as sentence-transformers pools it (mean by default)."""
    if pooling.get("mode") == "cls":
        emb = hidden[:, 0]
    else:
        weights = (mask if mask is not None else torch.ones(hidden.shape[:2], device=hidden.device)).unsqueeze(-1).to(hidden.dtype)
        emb = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
    return F.normalize(emb, dim=-1) if pooling.get("normalize") else emb


def task_loss(pred: torch.Tensor, rows: dict[str, torch.Tensor], task: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, count) of the task loss: cross-entropy per row, or per next token for LMs."""
    if task == "classification":
        return F.cross_entropy(pred.float(), rows["labels"], reduction="sum"), torch.tensor(float(len(pred)))
    if task == "causal-lm":
        ids = rows["input_ids"]
        mask = rows.get("attention_mask")
        mask = (mask[:, 1:] if mask is not None else torch.ones_like(ids[:, 1:])).float()
        per = F.cross_entropy(pred[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")
        return (per * mask).sum(), mask.sum()
    raise DataError(f"no task loss for {task!r} models; they are trained against a teacher")


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
