"""The two streams of hidden states compensation advances block by block.

Per calibration batch: the unpruned hidden states (original weights, no gates) and the
pruned ones (the plan's head and neuron gates, dropped layers skipped, earlier layers
already compensated), both entering the current block. One forward per batch, stopped
after the last block needed, first records how the model calls each block (masks, rotary
embeddings: everything but the hidden states); blocks are then re-run with those
arguments, so only the current block's hidden states are ever held.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from headprune_cli.errors import NumericalError
from headprune_cli.model.arch.base import HFModule, hidden_states_in
from headprune_cli.stages.refit.solve import Stats, linear_weights


class _Stop(Exception):
    """Raised from a hook: nothing after this point of the forward is needed."""


@dataclass
class _Call:
    """How the model called one block on one batch: everything except the hidden states."""

    args: tuple
    kwargs: dict
    keyword: bool  # the hidden states were passed as hidden_states=...

    def run(self, block: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        if self.keyword:
            out = block(*self.args, hidden_states=hidden, **self.kwargs)
        else:
            out = block(hidden, *self.args, **self.kwargs)
        return out[0] if isinstance(out, (tuple, list)) else out


class Streams:
    """Per calibration batch: the unpruned and the pruned hidden states entering the current block.

    `head_gates` and `ffn_gates` are the lists HeadGates and NeuronGates read: all ones
    (x * 1 is exact: the unpruned model), and only while the pruned stream runs a block do
    that block's entries hold the plan's gates (`head_removal`, `ffn_removal`)."""

    def __init__(
        self,
        model: nn.Module,
        blocks,
        last: int,
        head_removal: list[torch.Tensor],
        ffn_removal: list[torch.Tensor] | None,
    ):
        self.model, self.blocks, self.last = model, blocks, last
        self.removal = {"head": head_removal, "ffn": ffn_removal or []}
        self.head_gates = [torch.ones_like(g) for g in head_removal]
        self.ffn_gates = [torch.ones_like(g) for g in self.removal["ffn"]]
        self.calls: list[list[_Call]] = []  # [batch][block position]
        self.masks: list[torch.Tensor | None] = []  # real-token masks, [batch, seq]
        self.full: list[torch.Tensor] = []
        self.pruned: list[torch.Tensor] = []

    def record(self, batches: list[dict]) -> None:
        for batch in batches:
            first, calls = _record_calls(self.model, self.blocks, batch, self.last)
            self.calls.append(calls)
            self.masks.append(batch.get("attention_mask"))
            self.full.append(first)
            self.pruned.append(first)

    def _run_pruned(self, pos: int, i: int) -> torch.Tensor:
        lists = [(self.head_gates, self.removal["head"]), (self.ffn_gates, self.removal["ffn"])]
        for gates, removal in lists:
            if gates:
                gates[pos] = removal[pos]
        try:
            return self.calls[i][pos].run(self.blocks[pos], self.pruned[i])
        finally:
            for gates, removal in lists:
                if gates:
                    gates[pos] = torch.ones_like(removal[pos])

    def advance(self, pos: int, full: bool = True, pruned: bool = True) -> None:
        for i, calls in enumerate(self.calls):
            if full:
                self.full[i] = calls[pos].run(self.blocks[pos], self.full[i])
            if pruned:
                self.pruned[i] = self._run_pruned(pos, i)

    def statistics(
        self,
        pos: int,
        o: nn.Module,
        cols: torch.Tensor,
        has_bias: bool,
        advance_full: bool = True,
        rewritten: Sequence[Original] = (),
        residual: HFModule | None = None,
    ) -> Stats:
        """Sum [X 1]^T W [X 1], [X 1]^T W T, sum_t w_t |T_t|^2 for projection `o` of block `pos`:
        X = the kept input features `cols` in the pruned stream, T = the target (below),
        W = diag(w) the per-token weights (token_weights of |T_t|^2).

        T = Y + (R_unpruned - R_pruned): Y is `o`'s output in the unpruned stream, R the
        residual stream `o`'s output is added to, read as the input of `residual` (the
        adapter's residual_input) in each stream. So the fit puts the sum back on the unpruned
        model's residual stream, cancelling what upstream cuts left there as far as the kept
        features can, not only `o`'s own output (on SmolLM2-135M at 0.8 of the FLOPs: perplexity
        1.23x against 1.33x; BENCHMARKS.md "Residual targets"). Without `residual`
        (a norm sits between `o` and the addition, or no cut upstream), T = Y.

        With `advance_full` the unpruned stream moves on through the block; without it
        (another projection of the same block is fitted next) its run stops at `o`.
        `rewritten`: projections of this block already compensated, whose original weights
        the unpruned run must see."""
        stats: tuple[torch.Tensor, torch.Tensor, float, int] | None = None
        w_full, b_full = linear_weights(o)
        w_full, b_full = w_full.double(), (b_full.double() if b_full is not None else None)
        for i, calls in enumerate(self.calls):
            with _Captured(o) as seen, _Captured(residual) as stream:
                with _originals(rewritten):
                    if advance_full:
                        self.full[i] = calls[pos].run(self.blocks[pos], self.full[i])
                    else:
                        # run_until calls it at once, within this iteration: late binding is harmless
                        seen.run_until(lambda: calls[pos].run(self.blocks[pos], self.full[i]))  # noqa: B023
                x_full = _real_tokens(seen.input(), self.masks[i])
                r_full = _real_tokens(stream.input(), self.masks[i]) if residual is not None else None
                # Only the projection's input is needed: the block's output is dropped (the
                # pruned stream advances through the refit weights afterwards).
                seen.run_until(lambda: self._run_pruned(pos, i))  # noqa: B023 (called at once)
                x_kept = _real_tokens(seen.input(), self.masks[i])[:, cols.to(seen.input().device)]
            target = x_full @ w_full.to(x_full.device).T + (b_full.to(x_full.device) if b_full is not None else 0)
            if r_full is not None:  # float64 (_real_tokens): in bf16 the difference would lose its digits
                target += r_full - _real_tokens(stream.input(), self.masks[i])
            ones = torch.ones(len(x_kept), 1, dtype=x_kept.dtype, device=x_kept.device)
            xa = torch.cat([x_kept, ones], 1) if has_bias else x_kept
            norms = (target * target).sum(1)
            weights = token_weights(norms)
            xw = xa * weights[:, None]
            part = ((xw.T @ xa).cpu(), (xw.T @ target).cpu(), float((weights * norms).sum()), len(xa))
            if stats is not None:  # summed over the batches
                part = (stats[0] + part[0], stats[1] + part[1], stats[2] + part[2], stats[3] + part[3])
            stats = part
        assert stats is not None  # record() got the calibration batches, and calibration data is never empty
        if not torch.isfinite(stats[0]).all() or not torch.isfinite(stats[1]).all():
            raise NumericalError("calibration activations contain NaN or inf")
        return Stats(*stats, has_bias=has_bias)


@dataclass
class Original:
    """A projection's weights as they were before compensation rewrote them."""

    module: HFModule
    weight: torch.Tensor
    bias: torch.Tensor | None

    @classmethod
    def of(cls, module: HFModule) -> Original:
        bias = module.bias.detach().clone() if module.bias is not None else None
        return cls(module, module.weight.detach().clone(), bias)


@contextmanager
def _originals(saved: Sequence[Original]):
    """Put the original weights back for a while: the unpruned stream must not see a
    projection of its block that was rewritten a moment ago."""
    now = [Original.of(s.module) for s in saved]
    for s in saved:
        _copy_in(s)
    try:
        yield
    finally:
        for s in now:
            _copy_in(s)


def _copy_in(saved: Original) -> None:
    with torch.no_grad():
        saved.module.weight.copy_(saved.weight)
        if saved.bias is not None:
            saved.module.bias.copy_(saved.bias)


def _record_calls(model: nn.Module, blocks, batch: dict, last: int) -> tuple[torch.Tensor, list[_Call]]:
    """Block 0's hidden-state input and the other arguments of blocks 0..last, from one forward.

    Only block 0 computes: blocks 1..last are stood in for by `_PassThrough` while the
    model calls them, so recording costs one block, not a forward up to `last` (the
    arguments the model computes once, masks and rotary embeddings, do not depend on the
    hidden states). Only arguments are kept; no layer's activations are held."""
    calls: list[_Call] = []
    first = {}

    def record(module, args, kwargs):
        keyword = not args
        hidden = hidden_states_in(args, kwargs)
        if not calls:
            first["hidden"] = hidden.detach()
        rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        calls.append(_Call(tuple(args[1:]), rest, keyword))
        if len(calls) > last:
            raise _Stop

    handles = [blocks[pos].register_forward_pre_hook(record, with_kwargs=True) for pos in range(last + 1)]
    handles.append(blocks[0].register_forward_hook(_PassThrough.install(blocks[1 : last + 1])))
    try:
        model(**batch, **_no_cache(model))
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
        _PassThrough.remove(blocks[1 : last + 1])
    return first["hidden"], calls


class _PassThrough:
    """A block's forward replaced by one that returns its hidden-state input unchanged, in
    the shape of block 0's real output (a tensor, or a tuple led by the hidden states)."""

    def __init__(self, template):
        self.template = template

    def __call__(self, *args, **kwargs):
        hidden = hidden_states_in(args, kwargs)
        if isinstance(self.template, tuple):
            return (hidden, *self.template[1:])
        return hidden

    @classmethod
    def install(cls, blocks):
        """A forward hook for block 0: once its output is known, blocks 1.. pass through."""

        def hook(module, args, output):
            for block in blocks:
                block.forward = cls(output)  # an instance attribute: nn.Module calls it instead

        return hook

    @staticmethod
    def remove(blocks) -> None:
        for block in blocks:
            block.__dict__.pop("forward", None)


def _no_cache(model: nn.Module) -> dict:
    """A KV cache would grow each time a block is re-run with the recorded arguments."""
    return {"use_cache": False} if getattr(getattr(model, "config", None), "use_cache", None) is not None else {}


class _Captured:
    """The input of `o` (after any gate hook; a block's or norm's hidden states, positional or by
    keyword), each time it runs inside the block. `o` None: nothing is read."""

    def __init__(self, o: nn.Module | None):
        self.o, self._stop = o, False
        self.x: torch.Tensor | None = None

    def __enter__(self) -> _Captured:
        if self.o is not None:
            self._handle = self.o.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        if self.o is not None:
            self._handle.remove()

    def _hook(self, module, args, kwargs):
        self.x = hidden_states_in(args, kwargs).detach()
        if self._stop:
            raise _Stop

    def input(self) -> torch.Tensor:
        """The input last seen (the block's run has passed through `o`)."""
        assert self.x is not None, "the block ran without reaching the projection"
        return self.x

    def run_until(self, forward) -> None:
        """Run `forward` only as far as `o`'s input: what comes after is not needed."""
        self._stop = True
        try:
            forward()
        except _Stop:
            pass
        finally:
            self._stop = False


def token_weights(norms: torch.Tensor) -> torch.Tensor:
    """1 / |T_t|^2 per token: the fit minimises every token's error relative to its own
    target, as the next LayerNorm (RMSNorm) sees it, not the sum of squared errors, which a
    few tokens with massive activations own (all-MiniLM-L6-v2's layer-0 FFN puts 98.8% of
    its output energy in one dimension of the [CLS] token). The floor (1e-6 of the batch's
    mean) keeps a token with next to no output from owning the fit instead."""
    floor = 1e-6 * float(norms.mean()) if len(norms) else 0.0
    return 1.0 / norms.clamp_min(floor) if floor > 0 else torch.ones_like(norms)


def _real_tokens(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """[tokens, d] float64 rows of the tokens the mask marks as real (all when no mask fits)."""
    if mask is not None and x.dim() == 3 and mask.shape == x.shape[:2]:
        x = x[mask.to(x.device).bool()]
    return x.reshape(-1, x.shape[-1]).double()
