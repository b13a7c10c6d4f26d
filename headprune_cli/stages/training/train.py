"""Recovery training after pruning: AdamW, warmup + linear decay, optional distillation.

One optimizer step consumes `grad_accum` micro-batches of `batch_size` rows. The batch
size is global: under torchrun each of N processes takes every N-th row of each
micro-batch, and losses are divided by the global row/token count, so N processes
compute the same update as one: the same command gives the same weights whatever the
process count.

Data order is a pure function of (seed, epoch) and the step number, and the training
state (weights, AdamW moments, RNG, step, best-so-far) is saved to a safetensors + JSON
folder every `save_every` steps; `resume=True` continues from it and ends with the
same weights as an uninterrupted run. The output checkpoint is written only by the
caller, atomically, at the end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from headprune_cli.errors import NumericalError, UsageError
from headprune_cli.model.cost import count_params
from headprune_cli.model.layout import info_of
from headprune_cli.runtime import distributed
from headprune_cli.runtime.device import cast_parameters, resolve_device, resolve_dtype, stored_dtype
from headprune_cli.runtime.recompute import recomputed_blocks, wants_recompute
from headprune_cli.stages.objectives import higher_is_better as metric_higher_is_better
from headprune_cli.stages.objectives import next_token_mask
from headprune_cli.stages.options import RecoveryOptions
from headprune_cli.stages.training import sharding, streamed
from headprune_cli.stages.training import state as train_state
from headprune_cli.stages.training.distill import kd_logits
from headprune_cli.stages.training.gating import applied
from headprune_cli.stages.training.hidden import captured, hidden_loss, pairs
from headprune_cli.stages.training.losses import (
    as_tensors,
    check_labels,
    chunked_heads,
    chunked_kd_loss,
    chunked_task_loss,
    fidelity_loss,
    predict,
    task_loss,
    trim,
)
from headprune_cli.stages.training.precision import autocast_dtype, autocasting

# Recovery starts from trained weights, so it uses about a tenth of the rate the model
# size is usually fine-tuned at (BERT-base: ~2e-5 instead of 2e-4..5e-5 from scratch).
LR_BY_PARAMS = ((1e6, 2e-4), (1e7, 1e-4), (5e7, 3e-5), (2e8, 2e-5), (1e9, 1e-5), (math.inf, 5e-6))


# A model that lost whole layers has to re-route its computation, not just patch it: it
# recovers at a usual fine-tuning rate (BENCHMARKS.md, "Recovery after dropping layers").
DEEP_CUT_FACTOR = 3.0


def default_lr(model: nn.Module) -> float:
    params = count_params(model)
    lr = next(lr for limit, lr in LR_BY_PARAMS if params < limit)
    layout = info_of(model).layout
    return lr * DEEP_CUT_FACTOR if len(layout.layers) < layout.num_layers else lr


# What training reads is the recovery options themselves (stages/options.py), the options
# object `finetune` hands over; library callers build one directly.
FinetuneConfig = RecoveryOptions


@dataclass
class EpochRecord:
    epoch: int
    step: int
    train_loss: float | None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class FinetuneResult:
    model: nn.Module  # the trained (or best) model, unwrapped
    steps: int
    lr: float
    kd_weight: float
    history: list[EpochRecord]
    best_epoch: int | None
    completed: bool  # False when stopped by stop_after
    first_loss: float | None
    gates: dict | None = None  # `learn`: LearnedGates.report (set by the stage after closing)


class Plan:
    """Step arithmetic: which rows each optimizer step reads, and the learning rate."""

    def __init__(self, rows: int, cfg: FinetuneConfig, lr: float):
        if rows == 0:
            raise UsageError("the training set is empty")
        if cfg.batch_size < 1 or cfg.grad_accum < 1:
            raise UsageError("--batch-size and --grad-accum must be at least 1")
        if cfg.epochs is not None and cfg.steps is not None:
            raise UsageError("give --epochs or --steps, not both")
        self.rows, self.cfg, self.lr = rows, cfg, lr
        self.micro_per_epoch = math.ceil(rows / cfg.batch_size)
        self.steps_per_epoch = math.ceil(self.micro_per_epoch / cfg.grad_accum)
        self.total = (
            cfg.steps if cfg.steps is not None else self.steps_per_epoch * (1 if cfg.epochs is None else cfg.epochs)
        )
        if self.total < 1:
            raise UsageError("zero training steps: --steps/--epochs must be at least 1")
        warm = cfg.warmup * self.total if cfg.warmup < 1 else cfg.warmup
        self.warmup = min(int(round(warm)), self.total)

    def rate(self, step: int) -> float:
        """Linear warmup to lr, then linear decay to 0 at the last step (step is 0-based)."""
        if step < self.warmup:
            return self.lr * (step + 1) / (self.warmup + 1)
        return self.lr * max(0.0, (self.total - step) / max(1, self.total - self.warmup))

    def micro_batches(self, step: int) -> list[torch.Tensor]:
        """Row indices of each micro-batch of optimizer step `step`."""
        epoch, within = divmod(step, self.steps_per_epoch)
        order = torch.randperm(self.rows, generator=torch.Generator().manual_seed(self.cfg.seed * 100003 + epoch))
        first = within * self.cfg.grad_accum
        last = min(first + self.cfg.grad_accum, self.micro_per_epoch)
        size = self.cfg.batch_size
        return [order[i * size : (i + 1) * size] for i in range(first, last)]

    def epoch_ends(self, step: int) -> bool:
        """True after the last step of an epoch (step counted from 1)."""
        return step % self.steps_per_epoch == 0


def finetune(
    model: nn.Module,
    train,  # data.Dataset or {input_ids, attention_mask, labels?, token_type_ids?} tensors
    cfg: FinetuneConfig,
    eval_fn: Callable[[nn.Module], dict[str, float]] | None = None,
    higher_is_better: bool | None = None,
    teacher: nn.Module | None = None,
    on_step: Callable[[int, int, float, float], None] | None = None,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    fingerprint: dict | None = None,
    gating=None,
) -> FinetuneResult:
    """Train `model` in place on `train` tensors; see the module docstring.

    `eval_fn(model) -> {metric: value}` (first metric decides "best") runs before
    training and after every epoch; the best weights are returned. Whether higher is
    better comes from the metric's name (objectives.HIGHER_IS_BETTER) unless
    `higher_is_better` says it; a metric of unknown direction is refused. `on_step(step,
    total, loss, lr)` and `on_epoch(record)` feed progress displays (rank 0 only).
    `gating` (gates.HeadDropout or gates.LearnedGates) gates the heads of every training
    forward pass and adds its penalty; None trains the model as it is.
    """
    ctx = distributed.setup()
    if not ctx.active:  # DDP fixes each process's device; alone, --device decides
        ctx = replace(ctx, device=resolve_device(cfg.device))
    train = as_tensors(train)
    kd, plan = validate(model, train, cfg, teacher)
    lr = plan.lr
    torch.manual_seed(cfg.seed + ctx.rank)
    stored, compute = stored_dtype(model), resolve_dtype(cfg.dtype)
    loaded = teacher
    if teacher is not None and streamed.is_streamed(teacher):  # blocks read per forward: nothing to shard
        streamed.place(teacher, ctx.device, compute)
        loaded = None
    for m in (model, loaded):
        if m is not None and compute is not None:
            cast_parameters(m, compute)
        if m is not None:
            m.to(ctx.device)
        if m is not None and cfg.fsdp:
            sharding.shard(m, ctx)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay)
    fingerprint = {
        **(fingerprint or {}),
        "lr": lr,
        "kd": kd,
        "total": plan.total,
        "batch": cfg.batch_size,
        "accum": cfg.grad_accum,
        "seed": cfg.seed,
    }
    loop = _Loop(model, train, plan, optimizer, ctx, teacher, kd, cfg, eval_fn, higher_is_better, gating)
    start = loop.restore(fingerprint) if cfg.resume else 0
    if start == 0:
        loop.evaluate(0, 0, None, on_epoch)
    completed = loop.run(start, fingerprint, on_step, on_epoch)
    final = loop.final_model()
    if cfg.fsdp:  # rank 0 gets a plain model with the full weights; the others keep their shards
        optimizer.state.clear()  # AdamW's moments and the gradients are not needed any more: room for the gather
        final.zero_grad(set_to_none=True)
        final = sharding.gathered(final, ctx) or final
    if not (cfg.fsdp and not ctx.main):
        cast_parameters(final, stored)
    return FinetuneResult(final, loop.step, lr, kd, loop.history, loop.best_epoch, completed, loop.first_loss)


def hidden_weight(cfg: FinetuneConfig) -> float:
    """The layer distillation weight (None: the stage left it unset, which is none)."""
    return cfg.hidden_weight or 0.0


def validate(model: nn.Module, train, cfg: FinetuneConfig, teacher: nn.Module | None) -> tuple[float, Plan]:
    """Check everything before training starts; returns (kd weight, step plan)."""
    task = info_of(model).task
    train = as_tensors(train)
    check_labels(model, train)
    kd = (
        cfg.kd_weight
        if cfg.kd_weight is not None
        else (1.0 if task == "embedding" else 0.5 if teacher is not None else 0.0)
    )
    if task == "embedding" and teacher is None:
        raise UsageError(
            "an embedding model is recovered by matching a teacher's embeddings; pass --teacher auto or a checkpoint"
        )
    if hidden_weight(cfg) > 0 and teacher is None:
        raise UsageError("--hidden-weight > 0 needs a teacher (--teacher auto or a checkpoint)")
    if kd > 0 and teacher is None:
        raise UsageError("--kd-weight > 0 needs a teacher (--teacher auto or a checkpoint)")
    if not 0.0 <= kd <= 1.0:
        raise UsageError("--kd-weight must be between 0 and 1")
    if cfg.resume and cfg.state_dir is None:
        raise UsageError("--resume needs a state folder (--state-dir)")
    lr = cfg.lr if cfg.lr is not None else default_lr(model)
    if not lr > 0:
        raise UsageError(f"--lr must be a positive number (got {lr})")
    return kd, Plan(len(train["input_ids"]), cfg, lr)


class _Loop:
    def __init__(self, model, train, plan, optimizer, ctx, teacher, kd, cfg, eval_fn, higher, gating=None):
        self.model, self.train, self.plan, self.optimizer, self.ctx = model, train, plan, optimizer, ctx
        self.teacher, self.kd, self.cfg, self.eval_fn, self.higher = teacher, kd, cfg, eval_fn, higher
        self.gating = gating
        self.paired = pairs(model, teacher) if teacher is not None and hidden_weight(cfg) > 0 else []
        # A causal LM whose micro-batch (this process's rows) would outgrow its activation budget
        # recomputes its blocks in the backward: the same gradients, one more forward.
        rows = -(-cfg.batch_size // ctx.world)
        self.recompute = wants_recompute(model, cfg.recompute, rows * train["input_ids"].shape[1])
        self.autocast = autocast_dtype(ctx.device, cfg.autocast)
        self.wrapped = model if cfg.fsdp else _wrap(model, ctx)
        self.step, self.history, self.best, self.best_value, self.best_epoch = 0, [], None, None, None
        self.first_loss, self.epoch_losses = None, []

    # --- the loop ------------------------------------------------------------------
    def run(self, start: int, fingerprint: dict, on_step, on_epoch) -> bool:
        self.model.train()
        step = start
        while step < self.plan.total:
            if self.gating is not None:  # learned gates far from their target train a step longer
                self.plan.total += self.gating.extend(step, self.plan.total)
            loss = self.train_step(step)
            self.step = step + 1
            self.epoch_losses.append(loss)
            if on_step and self.ctx.main:
                on_step(self.step, self.plan.total, loss, self.plan.rate(step))
            if self.plan.epoch_ends(self.step) or self.step == self.plan.total:
                self.end_epoch(on_epoch)
            stop = self.cfg.stop_after is not None and self.step >= self.cfg.stop_after and self.step < self.plan.total
            if self.cfg.state_dir and (stop or self.step % self.cfg.save_every == 0):
                self.save(fingerprint)
            if stop:
                return False
            step += 1
        self.model.eval()
        return True

    def train_step(self, step: int) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = self.plan.rate(step)
        self.optimizer.zero_grad(set_to_none=True)
        if self.gating is not None:
            self.gating.zero_grad()
        total = 0.0
        micro = self.plan.micro_batches(step)
        counts = [self._count(idx) for idx in micro]  # global denominators, known up front
        grand = sum(counts)
        for i, (idx, count) in enumerate(zip(micro, counts)):
            total += self.micro_step(idx, count, grand, step, i)
        if self.gating is not None:
            self.gating.penalty_backward(
                step, self.plan.total
            )  # once per optimizer step; the loss shown stays the task's
        if not math.isfinite(total):
            raise NumericalError(f"training loss became {total} at step {step + 1}; lower --lr or check the data")
        if self.first_loss is None:
            self.first_loss = total
        if self.cfg.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        if self.gating is not None:
            self.gating.step()
        return total

    def _count(self, idx: torch.Tensor) -> float:
        """The global number of loss terms in a micro-batch (rows, or tokens for LMs)."""
        if info_of(self.model).task != "causal-lm":
            return float(len(idx))
        return float(next_token_mask({"attention_mask": self.train["attention_mask"][idx]}).sum())

    def micro_step(self, idx: torch.Tensor, count: float, grand: float, step: int = 0, micro: int = 0) -> float:
        rows = trim({k: v[idx] for k, v in self.train.items()})
        if self.gating is not None:  # drawn for the global micro-batch, then sharded with its rows
            rows.update(
                {
                    f"gate.{name}": g
                    for name, g in self.gating.sample(step, micro, len(rows["input_ids"]), self.plan.total).items()
                }
            )
        full, rows, weight = rows, distributed.shard(rows, self.ctx), 1.0
        if len(rows["input_ids"]) == 0:  # fewer rows than processes: join with a zero-weight row
            rows, weight = {k: v[:1] for k, v in full.items()}, 0.0
        gates = {k.removeprefix("gate."): rows.pop(k) for k in [k for k in rows if k.startswith("gate.")]}
        rows = {k: v.to(self.ctx.device) for k, v in rows.items()}
        task = info_of(self.model).task
        gated = applied(self.model, gates, self.ctx.device) if gates else nullcontext()
        # Gates stay on through the backward: a recomputed block must see the same hooks.
        # A causal LM's logits in chunks of tokens (one process: no wrapper owns the head's weights);
        # `pred` and `ref` are then last hidden states.
        chunked = chunked_heads(self.model, self.teacher, rows, alone=self.ctx.world == 1)
        with gated, recomputed_blocks(self.model, self.recompute), chunked as heads:
            with autocasting(self.ctx.device, self.autocast), self._hidden(self.model) as student_states:
                pred = predict(self.wrapped, rows, task, self.model)
            loss_sum = torch.zeros((), device=self.ctx.device)
            if self.kd > 0.0 or task == "embedding" or self.paired:
                with torch.no_grad(), autocasting(self.ctx.device, self.autocast), self._hidden(self.teacher) as states:
                    ref = predict(self.teacher, rows, task, self.teacher)
            with autocasting(self.ctx.device, self.autocast) if heads else nullcontext():  # the heads as in predict
                if self.kd < 1.0 and task != "embedding":
                    task_sum = task_loss(pred, rows, task)[0] if heads is None else chunked_task_loss(heads, pred, rows)
                    loss_sum = loss_sum + (1.0 - self.kd) * task_sum
                if self.kd > 0.0 or task == "embedding":
                    weight_kd = 1.0 if task == "embedding" else self.kd
                    loss_sum = loss_sum + weight_kd * self._kd(pred, ref, rows, task, heads)
            if self.paired:
                per_row = task != "causal-lm"  # a row's tokens share one row's weight, as the row losses do
                hidden = hidden_loss(student_states, states, self.paired, rows["attention_mask"], per_row)[0]
                loss_sum = loss_sum + hidden_weight(self.cfg) * hidden
            loss_sum = loss_sum * weight
            # DDP averages gradients over processes, hence the factor world.
            (loss_sum * self.ctx.world / grand).backward()
        return float(self.ctx.sum(loss_sum.detach()).item()) / grand

    def _hidden(self, model):
        """Capture the block outputs of `model` while layer distillation is on (--hidden-weight)."""
        return captured(model) if self.paired else nullcontext([])

    def _kd(self, pred, ref, rows, task, heads=None):
        if task == "embedding":
            return fidelity_loss(pred, ref, rows)[0]
        if heads is not None:
            return chunked_kd_loss(heads, pred, ref, rows, self.cfg.kd_temperature)
        if task == "causal-lm":
            return kd_logits(pred[:, :-1], ref[:, :-1], self.cfg.kd_temperature, next_token_mask(rows))[0]
        return kd_logits(pred, ref, self.cfg.kd_temperature)[0]

    # --- epochs, best model, state -------------------------------------------------------
    def end_epoch(self, on_epoch) -> None:
        mean = sum(self.epoch_losses) / len(self.epoch_losses) if self.epoch_losses else None
        self.epoch_losses = []
        epoch = math.ceil(self.step / self.plan.steps_per_epoch)
        self.evaluate(epoch, self.step, mean, on_epoch)
        self.model.train()

    def evaluate(self, epoch: int, step: int, loss, on_epoch) -> None:
        metrics = {}
        if self.eval_fn is not None:
            self.model.eval()
            with torch.no_grad(), self.gating.evaluating(self.model) if self.gating is not None else nullcontext():
                metrics = self.eval_fn(self.model)
            name, value = next(iter(metrics.items()))
            higher = self.higher if self.higher is not None else metric_higher_is_better(name)
            better = self.best_value is None or (value > self.best_value if higher else value < self.best_value)
            if better and (self.gating is None or self.gating.restores_best):
                self.best_value, self.best_epoch = value, epoch
                self.best = _snapshot(self.model)
        record = EpochRecord(epoch, step, loss, metrics)
        self.history.append(record)
        if on_epoch and self.ctx.main:
            on_epoch(record)

    def final_model(self) -> nn.Module:
        if self.best is not None:
            self.model.load_state_dict(self.best, strict=not _frozen(self.model))
        self.model.eval()
        return self.model

    def save(self, fingerprint: dict) -> None:
        if self.cfg.fsdp:  # every process writes its own shards
            layout = sharding.plan(self.model, self.ctx.world)
            sharding.save_state(
                self.cfg.state_dir,
                self.step,
                self.model,
                self.optimizer,
                self._scalars(fingerprint),
                self.best,
                self.ctx,
                layout,
            )
            return
        if self.ctx.main:
            scalars = self._scalars(fingerprint)
            train_state.save_state(self.cfg.state_dir, self.step, self.model, self.optimizer, scalars, self.best)
        self.ctx.barrier()

    def restore(self, fingerprint: dict) -> int:
        # validate() already refused --resume without a state folder.
        state, best = self._load_state(fingerprint)
        train_state.check_settings(state, fingerprint)
        if not 1 <= state["step"] <= self.plan.total:
            raise UsageError(
                f"--resume: the saved state is at step {state['step']}, "
                f"outside this run's 1..{self.plan.total}; start over without --resume"
            )
        self.step, self.best = state["step"], best
        self.history = [EpochRecord(**r) for r in state["history"]]
        self.best_value, self.best_epoch = state["best_value"], state["best_epoch"]
        self.first_loss, self.epoch_losses = state["first_loss"], state["epoch_losses"]
        return self.step

    def _scalars(self, fingerprint: dict) -> dict:
        return {
            "fingerprint": fingerprint,
            "history": [r.__dict__ for r in self.history],
            "best_value": self.best_value,
            "best_epoch": self.best_epoch,
            "first_loss": self.first_loss,
            "epoch_losses": self.epoch_losses,
        }

    def _load_state(self, fingerprint: dict):
        if not self.cfg.fsdp:
            return train_state.load_state(self.cfg.state_dir, self.model, self.optimizer, fingerprint)
        target, state = sharding.read_state_agreed(
            self.cfg.state_dir, sharding.plan(self.model, self.ctx.world), self.ctx
        )
        train_state.check_settings(state, fingerprint)
        like = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return state, sharding.load_state(target, state, self.model, self.optimizer, self.ctx, like)


def _frozen(model: nn.Module) -> bool:
    """Whether part of the model does not train (LoRA's frozen base weights)."""
    return any(not p.requires_grad for p in model.parameters())


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the weights that can change: all of them, or only the trainable ones when the
    rest is frozen (LoRA: the adapters, not another copy of the whole model)."""
    if not _frozen(model):
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}


def _wrap(model: nn.Module, ctx) -> nn.Module:
    if not ctx.active:
        return model

    # Some modules (a pooler the loss does not use) get no gradient; DDP must allow it.
    return DistributedDataParallel(model, find_unused_parameters=True)
