"""Losses and metrics per objective: classification, causal-lm, fidelity.

- classification: cross-entropy on `labels`; metrics accuracy and macro-F1.
- causal-lm: next-token negative log-likelihood over real (attention_mask = 1) tokens;
  an example's loss is the mean over its predicted tokens; metric perplexity
  (exp of the token-weighted mean NLL over the whole dataset).
- fidelity (label-free): 1 - cosine similarity between the model's output and the
  unpruned reference model's output on the same input. The output is the logits when
  the model has them (per token for a causal LM, averaged over real tokens), else the
  pooled embedding (info.pooling mode mean/cls/max, L2-normalised when pooling.normalize).
  Metric `fidelity` = mean cosine to the reference (1.0 = identical).

Every per-example loss is a [batch] tensor; the loss of a batch is their mean.
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from headprune_cli.data.readers import Dataset, batches
from headprune_cli.errors import DataError, NumericalError, UsageError
from headprune_cli.model.layout import info_of
from headprune_cli.names import did_you_mean
from headprune_cli.runtime.device import input_device

OBJECTIVES = ("classification", "causal-lm", "fidelity")
# Metrics that are fractions in [0, 1]. Every --max-drop speaks of them in points (x100,
# 1.0 = one percentage point), the unit people quote accuracy drops in; others (perplexity)
# in their own unit.
POINT_METRICS = ("accuracy", "macro_f1", "fidelity", "token_accuracy", "next_word_accuracy")
_TASK_OBJECTIVE = {"classification": "classification", "causal-lm": "causal-lm", "embedding": "fidelity"}
# Which way each metric improves. Every Metric takes its direction from here, and so does
# finetune's choice of the best epoch: one table, not a guess per caller.
HIGHER_IS_BETTER = {
    "accuracy": True,
    "macro_f1": True,
    "fidelity": True,
    "perplexity": False,
    "token_accuracy": True,  # causal LMs in report (stages/report/zero_shot.py)
    "next_word_accuracy": True,
}


@dataclass
class Metric:
    name: str
    value: float
    higher_is_better: bool

    def to_dict(self) -> dict:
        return {"name": self.name, "value": self.value, "higher_is_better": self.higher_is_better}


def higher_is_better(metric: str) -> bool:
    """Whether a larger value of `metric` is better; an unknown metric is refused, not guessed."""
    if metric not in HIGHER_IS_BETTER:
        raise UsageError(
            f"metric {metric!r} has no known direction (known: "
            f"{', '.join(HIGHER_IS_BETTER)}); say whether higher is better"
        )
    return HIGHER_IS_BETTER[metric]


def metric(name: str, value: float) -> Metric:
    return Metric(name, value, higher_is_better(name))


def drop_unit(name: str) -> str:
    """The unit of a --max-drop budget on metric `name`: 'points' or the metric's own."""
    return "points" if name in POINT_METRICS else name


def worse_by(name: str, higher_is_better: bool, baseline: float, value: float) -> float:
    """How much worse `value` is than `baseline` (negative: better), in drop_unit(name)."""
    worse = worse_than(higher_is_better, baseline, value)
    return worse * 100 if name in POINT_METRICS else worse


def worse_than(higher_is_better: bool, baseline: float, value: float) -> float:
    """How much worse `value` is than `baseline` (negative: better), in the metric's own unit."""
    return (baseline - value) if higher_is_better else (value - baseline)


def default_objective(model: nn.Module) -> str:
    """classification for classifiers, causal-lm for LM heads, fidelity for embedding models."""
    return _TASK_OBJECTIVE.get(info_of(model).task, "fidelity")


def check_objective(name: str | None, model: nn.Module) -> str:
    """The objective to use: `name` validated against the model, or the model's default."""
    if name is None:
        return default_objective(model)
    if name not in OBJECTIVES:
        raise UsageError(f"unknown objective {name!r}" + did_you_mean(name, OBJECTIVES))
    task = info_of(model).task
    if name == "classification" and task != "classification":
        raise UsageError(f"objective classification needs a classifier; this model's task is {task}")
    if name == "causal-lm" and task != "causal-lm":
        raise UsageError(f"objective causal-lm needs a causal language model; this model's task is {task}")
    return name


def needs_labels(objective: str) -> bool:
    return objective == "classification"


# --- model outputs --------------------------------------------------------------------------
def model_inputs(batch: dict) -> dict:
    """The batch without labels: losses are computed here, not inside the model."""
    return {k: v for k, v in batch.items() if k != "labels"}


def outputs_of(model: nn.Module, batch: dict) -> torch.Tensor:
    """Logits when the model has a task head, else its last hidden state."""
    out = model(**model_inputs(batch), **_without_cache(model))
    logits = getattr(out, "logits", None)
    return logits if logits is not None else out.last_hidden_state


def _without_cache(model: nn.Module) -> dict:
    """use_cache=False for models that take it: a loss over whole sequences needs no KV cache, and
    a block recomputed in the backward (score --recompute) must not append to one twice."""
    # classes are hashable; mypy reads a type[X] value's __hash__ as the unbound method (python/mypy#20409)
    return {"use_cache": False} if _takes_use_cache(type(model)) else {}  # type: ignore[arg-type]


@functools.cache
def _takes_use_cache(cls: type[nn.Module]) -> bool:
    """Looked up once per model class: this runs on every scoring and evaluation batch."""
    return "use_cache" in inspect.signature(cls.forward).parameters


def pool(model: nn.Module, out: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token hidden states -> one embedding per example (info.pooling); logits pass through."""
    if info_of(model).task != "embedding" or out.dim() != 3:
        return out
    pooling = info_of(model).pooling or {}
    mode = pooling.get("mode", "mean")
    weights = mask.unsqueeze(-1).to(out.dtype)
    if mode == "cls":
        pooled = out[:, 0]
    elif mode == "max":
        pooled = out.masked_fill(weights == 0, torch.finfo(out.dtype).min).max(dim=1).values
    else:
        pooled = (out * weights).sum(1) / weights.sum(1).clamp(min=1.0)
    return F.normalize(pooled, dim=-1) if pooling.get("normalize") else pooled


def embed(model: nn.Module, batch: dict) -> torch.Tensor:
    """What fidelity compares: logits ([B, C] or [B, T, V]) or pooled embeddings [B, D]."""
    return pool(model, outputs_of(model, batch), batch["attention_mask"])


# --- losses ---------------------------------------------------------------------------------
def per_example_loss(
    out: torch.Tensor, batch: dict, objective: str, reference: torch.Tensor | None = None
) -> torch.Tensor:
    """Loss of every example [B] from `out` = embed(model, batch) (or its logits)."""
    if objective == "classification":
        if "labels" not in batch:
            raise DataError("classification needs labels in the data")
        return F.cross_entropy(_wide(out), batch["labels"], reduction="none")
    if objective == "causal-lm":
        nll, count = token_nll(out, batch)
        return nll / count.clamp(min=1)
    if objective == "fidelity":
        if reference is None:
            raise UsageError("the fidelity objective needs the reference model's outputs")
        return 1.0 - cosine(out, reference, batch["attention_mask"])
    raise UsageError(f"unknown objective {objective!r}" + did_you_mean(objective, OBJECTIVES))


def token_nll(logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token NLL per example and the number of predicted tokens per example."""
    ids = batch["input_ids"]
    valid = next_token_mask(batch).to(logits.dtype)
    nll = F.cross_entropy(_wide(logits[:, :-1]).transpose(1, 2), ids[:, 1:], reduction="none")
    return (nll * valid).sum(1), valid.sum(1)


def next_token_mask(batch: dict) -> torch.Tensor:
    """1.0 at positions t whose next token t+1 is predicted: both must be real tokens."""
    mask = batch["attention_mask"]
    return (mask[:, 1:] * mask[:, :-1]).float()


def cosine(out: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cosine similarity per example; per-token outputs are averaged over real tokens."""
    sim = F.cosine_similarity(_wide(out), _wide(reference), dim=-1, eps=1e-12)
    if sim.dim() == 1:
        return sim
    weights = mask[:, : sim.shape[1]].to(sim.dtype)
    return (sim * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def _wide(x: torch.Tensor) -> torch.Tensor:
    """Losses in at least float32 (half-precision logits lose too much), float64 kept."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def check_finite(loss: torch.Tensor, where: str) -> None:
    if not torch.isfinite(loss).all():
        raise NumericalError(f"the loss is NaN/inf on {where}; check the data and the model's weights")


# --- evaluation -----------------------------------------------------------------------------
@torch.no_grad()
def evaluate(
    model: nn.Module, dataset: Dataset, objective: str, reference: nn.Module | None = None, batch_size: int = 32
) -> list[Metric]:
    """accuracy + macro_f1 (classification), perplexity (causal-lm), fidelity (fidelity)."""
    was_training = model.training
    model.eval()
    try:
        if objective == "classification":
            return _classification(model, dataset, batch_size)
        if objective == "causal-lm":
            return _perplexity(model, dataset, batch_size)
        if objective == "fidelity":
            return _fidelity(model, reference or model, dataset, batch_size)
        raise UsageError(f"unknown objective {objective!r}" + did_you_mean(objective, OBJECTIVES))
    finally:
        model.train(was_training)


def _batches_on(model: nn.Module, dataset: Dataset, batch_size: int):
    """Evaluation batches on the device where the model takes its inputs."""
    device = input_device(model)
    for batch in batches(dataset, batch_size):
        yield {k: v.to(device) for k, v in batch.items()}


def _classification(model: nn.Module, dataset: Dataset, batch_size: int) -> list[Metric]:
    if dataset.labels is None:
        raise DataError("classification metrics need labels in the data")
    predicted = []
    for number, batch in enumerate(_batches_on(model, dataset, batch_size)):
        logits = embed(model, batch)
        check_finite(logits, f"batch {number}")
        predicted.append(logits.argmax(-1).cpu())
    pred, gold = torch.cat(predicted), dataset.labels
    f1 = []
    for c in sorted(set(gold.tolist()) | set(pred.tolist())):
        tp = int(((pred == c) & (gold == c)).sum())
        denom = int((pred == c).sum()) + int((gold == c).sum())
        f1.append(2 * tp / denom if denom else 0.0)
    return [
        metric("accuracy", float((pred == gold).double().mean())),
        metric("macro_f1", float(sum(f1) / len(f1))),
    ]


LOG_MAX_FLOAT = math.log(sys.float_info.max)


def _perplexity(model: nn.Module, dataset: Dataset, batch_size: int) -> list[Metric]:
    total, count = 0.0, 0.0
    for number, batch in enumerate(_batches_on(model, dataset, batch_size)):
        nll, tokens = token_nll(outputs_of(model, batch), batch)
        check_finite(nll, f"batch {number}")
        total += float(nll.double().sum())
        count += float(tokens.sum())
    if count == 0:
        raise DataError("perplexity needs examples of at least two tokens")
    # exp() of a mean loss above ~709.8 overflows: such a model is useless, and reporting
    # the largest finite perplexity lets a report gate fail (exit 3) instead of crashing.
    mean = total / count
    return [metric("perplexity", math.exp(mean) if mean < LOG_MAX_FLOAT else sys.float_info.max)]


def _fidelity(model: nn.Module, reference: nn.Module, dataset: Dataset, batch_size: int) -> list[Metric]:
    total = 0.0
    for number, batch in enumerate(_batches_on(model, dataset, batch_size)):
        sim = cosine(embed(model, batch), embed(reference, batch), batch["attention_mask"])
        check_finite(sim, f"batch {number}")
        total += float(sim.double().sum())
    return [metric("fidelity", total / len(dataset))]


def metric_dicts(metrics) -> list[dict]:
    """Metrics as artifacts record them: name, value, higher_is_better."""
    return [{"name": m.name, "value": float(m.value), "higher_is_better": bool(m.higher_is_better)} for m in metrics]
