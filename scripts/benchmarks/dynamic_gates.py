"""Input-dependent heads on a BERT-family classifier: a functional encoder whose layers
run a chosen subset of heads, per-layer gate networks trained with the model frozen,
and a router among nested static widths (scripts/benchmarks/dynamic_heads.py drives it).

Every variant (the full model, the static cut, per-head gating, routed widths) runs through
the same functional forward (`encode`), so that timings differ only by the work each does:
each layer keeps its Q/K/V rows per head as one [heads, 3 * head_dim, width] tensor (a head
subset is one `index_select`, a prefix of heads is a view) and its output projection
transposed as [heads, head_dim, width].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# --- the functional encoder -----------------------------------------------------------


@dataclass
class Layer:
    qkv: torch.Tensor  # [heads, 3 * head_dim, width]: each head's query, key and value rows
    qkv_bias: torch.Tensor  # [heads, 3 * head_dim]
    out: torch.Tensor  # [heads, head_dim, width]: the output projection, transposed, per head
    out_bias: torch.Tensor  # [width]
    norm1: nn.LayerNorm
    up: nn.Linear
    down: nn.Linear
    norm2: nn.LayerNorm

    @property
    def heads(self) -> int:
        return int(self.qkv.shape[0])


@dataclass
class Encoder:
    embeddings: nn.Module
    layers: list[Layer]
    pooler: nn.Linear
    classifier: nn.Linear
    head_dim: int
    act: nn.Module


def encoder_of(model: nn.Module) -> Encoder:
    """The weights of a (possibly pruned) BertForSequenceClassification, regrouped per head."""
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    layers = []
    for block in model.bert.encoder.layer:
        attn = block.attention.self
        width = attn.query.weight.shape[1]
        heads = attn.query.weight.shape[0] // head_dim
        w = torch.stack([m.weight.view(heads, head_dim, width) for m in (attn.query, attn.key, attn.value)], 1)
        b = torch.stack([m.bias.view(heads, head_dim) for m in (attn.query, attn.key, attn.value)], 1)
        o = block.attention.output.dense
        layers.append(
            Layer(
                qkv=w.reshape(heads, 3 * head_dim, width).contiguous().detach(),
                qkv_bias=b.reshape(heads, 3 * head_dim).contiguous().detach(),
                out=o.weight.t().reshape(heads, head_dim, width).contiguous().detach(),
                out_bias=o.bias.detach(),
                norm1=block.attention.output.LayerNorm,
                up=block.intermediate.dense,
                down=block.output.dense,
                norm2=block.output.LayerNorm,
            )
        )
    return Encoder(model.bert.embeddings, layers, model.bert.pooler.dense, model.classifier, head_dim, nn.GELU())


def pooled(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of the real tokens' hidden states: [batch, width]."""
    m = mask[..., None].to(x.dtype)
    return (x * m).sum(1) / m.sum(1).clamp(min=1)


def attention(
    layer: Layer, x: torch.Tensor, bias: torch.Tensor, head_dim: int, heads: torch.Tensor | None
) -> torch.Tensor:
    """Per-head context [batch, seq, k, head_dim] of the heads in `heads` (all when None)."""
    qkv, qkv_bias = (layer.qkv, layer.qkv_bias) if heads is None else (layer.qkv[heads], layer.qkv_bias[heads])
    k = qkv.shape[0]
    y = F.linear(x, qkv.view(-1, x.shape[-1]), qkv_bias.view(-1)).view(*x.shape[:2], k, 3, head_dim)
    q, key, v = (t.transpose(1, 2) for t in y.unbind(3))
    return F.scaled_dot_product_attention(q, key, v, attn_mask=bias).transpose(1, 2)


def project(layer: Layer, ctx: torch.Tensor, heads: torch.Tensor | None, extra: torch.Tensor | None) -> torch.Tensor:
    """The output projection of the heads in `heads`, plus `extra` (compensation), no residual."""
    out = layer.out if heads is None else layer.out[heads]
    y = ctx.reshape(*ctx.shape[:2], -1) @ out.view(-1, out.shape[-1]) + layer.out_bias
    return y if extra is None else y + extra[:, None, :]


def feed_forward(layer: Layer, a: torch.Tensor, act: nn.Module) -> torch.Tensor:
    return layer.norm2(layer.down(act(layer.up(a))) + a)


def mask_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention mask [batch, 1, 1, seq]: 0 for real tokens, the dtype's minimum for padding."""
    return ((1 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min).to(dtype)


def head_out(enc: Encoder, x: torch.Tensor) -> torch.Tensor:
    return enc.classifier(torch.tanh(enc.pooler(x[:, 0])))


def embed(enc: Encoder, batch: dict) -> torch.Tensor:
    return enc.embeddings(input_ids=batch["input_ids"], token_type_ids=batch.get("token_type_ids"))


def encode(enc: Encoder, batch: dict) -> torch.Tensor:
    """Logits of the static model (every head each layer holds)."""
    x = embed(enc, batch)
    bias = mask_bias(batch["attention_mask"], x.dtype)
    for layer in enc.layers:
        x = layer.norm1(project(layer, attention(layer, x, bias, enc.head_dim, None), None, None) + x)
        x = feed_forward(layer, x, enc.act)
    return head_out(enc, x)


# --- per-layer gates --------------------------------------------------------------------


class Gates(nn.Module):
    """One linear gate per layer: the mean of the layer's input -> one logit per head.

    Starts as the static per-layer ranking (zero weights, the scores as biases), so before
    training the top-k of every input is the static uniform top-k of the same scores.
    """

    def __init__(self, scores: list[list[float]], width: int):
        super().__init__()
        self.nets = nn.ModuleList()
        for layer_scores in scores:
            s = torch.tensor(layer_scores, dtype=torch.float32)
            net = nn.Linear(width, len(layer_scores))
            nn.init.zeros_(net.weight)
            with torch.no_grad():
                net.bias.copy_((s - s.mean()) / s.std().clamp(min=1e-12))
            self.nets.append(net)

    def forward(self, pos: int, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.nets[pos](pooled(x, mask))


def check_budget(keep: float, heads: int) -> None:
    """A gate that keeps more heads than its layer has is not a budget (refused, never clipped)."""
    if keep > heads:
        raise ValueError(f"gate budget {keep:g} heads per layer is above the head count ({heads})")
    if keep < 1:
        raise ValueError(f"gate budget must keep at least 1 head per layer (got {keep:g})")


def top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """[batch, k] indices of the k largest logits, sorted (so equal subsets compare equal)."""
    return logits.topk(k, dim=-1).indices.sort(dim=-1).values


def compensation_vectors(enc: Encoder, data: list[dict]) -> list[torch.Tensor]:
    """Per layer [heads, width]: each head's mean contribution to the output projection over the
    real tokens of `data` (what a skipped head is replaced by: its mean output)."""
    sums = [torch.zeros(layer.heads, enc.head_dim) for layer in enc.layers]
    count = 0
    with torch.no_grad():
        for batch in data:
            x = embed(enc, batch)
            mask = batch["attention_mask"]
            bias = mask_bias(mask, x.dtype)
            m = mask[..., None, None].to(x.dtype)
            for pos, layer in enumerate(enc.layers):
                ctx = attention(layer, x, bias, enc.head_dim, None)
                sums[pos] += (ctx * m).sum((0, 1))
                x = layer.norm1(project(layer, ctx, None, None) + x)
                x = feed_forward(layer, x, enc.act)
            count += int(mask.sum())
    return [torch.einsum("hd,hdw->hw", s / count, layer.out) for s, layer in zip(sums, enc.layers, strict=True)]


def gated_soft(enc: Encoder, gates: Gates, comp: list[torch.Tensor], batch: dict, keep: int) -> torch.Tensor:
    """Training forward: every head computed, multiplied by a straight-through top-k mask (the hard
    top-k forward, the sigmoid's gradient backward); a skipped head adds its mean output instead."""
    x = embed(enc, batch)
    mask = batch["attention_mask"]
    bias = mask_bias(mask, x.dtype)
    for pos, layer in enumerate(enc.layers):
        logits = gates(pos, x, mask)
        soft = torch.sigmoid(logits)
        hard = torch.zeros_like(soft).scatter(1, logits.topk(keep, dim=-1).indices, 1.0)
        m = hard + soft - soft.detach()
        ctx = attention(layer, x, bias, enc.head_dim, None) * m[:, None, :, None]
        x = layer.norm1(project(layer, ctx, None, (1 - m) @ comp[pos]) + x)
        x = feed_forward(layer, x, enc.act)
    return head_out(enc, x)


def gated_masked(enc: Encoder, gates: Gates, comp: list[torch.Tensor], batch: dict, keep: int) -> torch.Tensor:
    """Inference with a hard top-k mask but every head computed (no work skipped): the reference
    the skipping paths must reproduce, and the 'mask' row of the timings."""
    x = embed(enc, batch)
    mask = batch["attention_mask"]
    bias = mask_bias(mask, x.dtype)
    for pos, layer in enumerate(enc.layers):
        picked = top_k(gates(pos, x, mask), keep)
        m = torch.zeros(x.shape[0], layer.heads).scatter(1, picked, 1.0)
        ctx = attention(layer, x, bias, enc.head_dim, None) * m[:, None, :, None]
        x = layer.norm1(project(layer, ctx, None, (1 - m) @ comp[pos]) + x)
        x = feed_forward(layer, x, enc.act)
    return head_out(enc, x)


def gated_skip(enc: Encoder, gates: Gates, comp: list[torch.Tensor], batch: dict, keep: int) -> torch.Tensor:
    """Inference that computes only the picked heads: per layer, rows are grouped by their head
    subset and each group runs its heads' gathered weights (batch 1: one group)."""
    x = embed(enc, batch)
    mask = batch["attention_mask"]
    bias = mask_bias(mask, x.dtype)
    for pos, layer in enumerate(enc.layers):
        picked = top_k(gates(pos, x, mask), keep)
        skipped = comp[pos].sum(0) - comp[pos][picked].sum(1)  # [batch, width]
        if x.shape[0] == 1:
            heads = picked[0]
            y = project(layer, attention(layer, x, bias, enc.head_dim, heads), heads, skipped)
        else:
            y = torch.empty_like(x)
            subsets, group = torch.unique(picked, dim=0, return_inverse=True)
            for g, heads in enumerate(subsets):
                rows = (group == g).nonzero().squeeze(1)
                ctx = attention(layer, x[rows], bias[rows], enc.head_dim, heads)
                y[rows] = project(layer, ctx, heads, skipped[rows])
        x = layer.norm1(y + x)
        x = feed_forward(layer, x, enc.act)
    return head_out(enc, x)


def freeze(enc: Encoder) -> None:
    """No gradient for the model's own weights (the per-head tensors are detached already)."""
    modules = [enc.embeddings, enc.pooler, enc.classifier]
    modules += [m for layer in enc.layers for m in (layer.norm1, layer.up, layer.down, layer.norm2)]
    for module in modules:
        module.requires_grad_(False)


def train_gates(
    enc: Encoder,
    gates: Gates,
    comp: list[torch.Tensor],
    data: list[dict],
    teacher: list[torch.Tensor],
    keep: int,
    epochs: int,
    lr: float,
    seed: int,
) -> list[float]:
    """KD (KL to the unpruned model's distribution) with the model frozen; only the gates learn.
    Returns the mean loss per epoch."""
    freeze(enc)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(gates.parameters(), lr=lr)
    history = []
    for _ in range(epochs):
        total = 0.0
        for i in torch.randperm(len(data)).tolist():
            logits = gated_soft(enc, gates, comp, data[i], keep)
            loss = F.kl_div(
                F.log_softmax(logits, -1), F.log_softmax(teacher[i], -1), log_target=True, reduction="batchmean"
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach())
        history.append(total / len(data))
    return history


# --- nested widths and the router -------------------------------------------------------


def nested_orders(kept: list[list[list[int]]], heads: int) -> list[list[int]] | None:
    """Per layer, an order of the original heads such that every width's kept heads are a prefix
    (widths given narrowest first, each kept[w][layer] a list of original heads); None when the
    widths are not nested."""
    orders = []
    for layer in range(len(kept[0])):
        order: list[int] = []
        for width in kept:
            new = sorted(set(width[layer]) - set(order))
            if not set(order) <= set(width[layer]):
                return None
            order += new
        orders.append(order + sorted(set(range(heads)) - set(order)))
    return orders


def width_view(full: Encoder, orders: list[list[int]], pruned: Encoder) -> Encoder:
    """A width that shares `full`'s Q/K/V, FFN and embedding storage: `full` holds each layer's heads
    in `orders` (see `reorder`), so the width's Q/K/V are a prefix view; its output projection and
    bias are the width's own (lstsq compensation refits them), put in the same order."""
    layers = []
    for layer, own, order in zip(full.layers, pruned.layers, orders, strict=True):
        k = own.heads
        ascending = sorted(order[:k])  # a pruned checkpoint keeps its heads in original order
        out = own.out[torch.tensor([ascending.index(h) for h in order[:k]])].contiguous()
        layers.append(
            Layer(
                qkv=layer.qkv[:k],
                qkv_bias=layer.qkv_bias[:k],
                out=out,
                out_bias=own.out_bias,
                norm1=layer.norm1,
                up=layer.up,
                down=layer.down,
                norm2=layer.norm2,
            )
        )
    return Encoder(full.embeddings, layers, full.pooler, full.classifier, full.head_dim, full.act)


def reorder(enc: Encoder, orders: list[list[int]]) -> Encoder:
    """The same model with each layer's heads stored in `orders` (outputs unchanged)."""
    layers = []
    for layer, order in zip(enc.layers, orders, strict=True):
        idx = torch.tensor(order)
        layers.append(
            Layer(
                layer.qkv[idx].contiguous(),
                layer.qkv_bias[idx].contiguous(),
                layer.out[idx].contiguous(),
                layer.out_bias,
                layer.norm1,
                layer.up,
                layer.down,
                layer.norm2,
            )
        )
    return Encoder(enc.embeddings, layers, enc.pooler, enc.classifier, enc.head_dim, enc.act)


class Router(nn.Module):
    """Embedding-output mean -> for each width, the probability that it agrees with the full model."""

    def __init__(self, width: int, widths: int):
        super().__init__()
        self.net = nn.Linear(width, widths)

    def forward(self, x0: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.net(pooled(x0, mask)))


def train_router(router: Router, feats: torch.Tensor, agree: torch.Tensor, steps: int, seed: int) -> None:
    """Full-batch logistic regression of agreement (rows x widths, 0/1) on pooled embeddings."""
    torch.manual_seed(seed)
    mean, std = feats.mean(0), feats.std(0).clamp(min=1e-6)
    with torch.no_grad():  # standardise inside the layer, so the router needs no separate scaler
        router.net.weight.zero_()
        router.net.bias.zero_()
    opt = torch.optim.Adam(router.parameters(), lr=0.05)
    z = (feats - mean) / std
    for _ in range(steps):
        p = torch.sigmoid(router.net(z))
        loss = F.binary_cross_entropy(p, agree) + 1e-3 * router.net.weight.pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        router.net.bias -= router.net.weight @ (mean / std)
        router.net.weight /= std


def choose(p: torch.Tensor, threshold: float) -> torch.Tensor:
    """The narrowest width whose predicted agreement reaches `threshold` (the widest otherwise)."""
    ok = p >= threshold
    ok[:, -1] = True
    return ok.float().argmax(1)


def threshold_for(p: torch.Tensor, cost: list[int], budget: float) -> float:
    """The highest threshold (the widest picks) whose average cost on these rows is within budget."""
    costs = torch.tensor(cost, dtype=torch.float)
    for t in sorted(set(p[:, :-1].flatten().tolist()) | {1.01}, reverse=True):
        if float(costs[choose(p, t)].mean()) <= budget:
            return t
    return 0.0
