"""The built-in reference encoder: a classic pre-LN Transformer encoder classifier.

Unlike the Hugging Face families it allows a different head count per layer from the
start, which makes it the simplest model on which to see what pruning does. It speaks
the same calling convention as transformers models: `model(input_ids=...,
attention_mask=..., labels=...)` returns an object with `.logits` and `.loss`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from headprune_cli.errors import ArchitectureError
from headprune_cli.model.arch.base import Adapter, AttentionView, FFNView, HFModule


@dataclass
class ReferenceConfig:
    vocab_size: int = 64
    max_position: int = 64
    hidden_size: int = 64
    heads_per_layer: list[int] = field(default_factory=lambda: [4, 4])
    head_dim: int = 16
    intermediate_size: int = 128
    num_labels: int = 2
    id2label: dict[str, str] = field(default_factory=dict)
    pad_token_id: int = 0
    model_type: str = "headprune-reference"

    @property
    def num_hidden_layers(self) -> int:
        return len(self.heads_per_layer)

    def to_dict(self) -> dict:
        return asdict(self)


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, num_heads: int, head_dim: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(hidden, num_heads * head_dim)
        self.k_proj = nn.Linear(hidden, num_heads * head_dim)
        self.v_proj = nn.Linear(hidden, num_heads * head_dim)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, seq, _ = x.shape
        shape = (batch, seq, self.num_heads, self.head_dim)
        q, k, v = (p(x).view(shape).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~mask[:, None, None, :], torch.finfo(scores.dtype).min)
        probs = scores.softmax(dim=-1)
        heads = (probs @ v).transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim)
        return self.o_proj(heads), probs


class Block(nn.Module):
    def __init__(self, config: ReferenceConfig, num_heads: int):
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.hidden_size)
        self.attention = SelfAttention(config.hidden_size, num_heads, config.head_dim)
        self.ln_mlp = nn.LayerNorm(config.hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(config.hidden_size, config.intermediate_size),
            nn.GELU(),
            nn.Linear(config.intermediate_size, config.hidden_size),
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attn_out, probs = self.attention(self.ln_attn(x), mask)
        x = x + attn_out
        return x + self.mlp(self.ln_mlp(x)), probs


class ReferenceEncoder(nn.Module):
    """Token + position embeddings, pre-LN blocks, final LN, mean pool, linear classifier."""

    def __init__(self, config: ReferenceConfig):
        super().__init__()
        if any(h < 1 for h in config.heads_per_layer):
            raise ArchitectureError("every layer of the reference encoder needs at least one head")
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embedding = nn.Embedding(config.max_position, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, h) for h in config.heads_per_layer)
        self.ln_final = nn.LayerNorm(config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids, attention_mask=None, labels=None, output_attentions=False, **_):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        mask = attention_mask.bool()
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.token_embedding(input_ids) + self.position_embedding(positions)[None]
        attentions = []
        for layer in self.layers:
            x, probs = layer(x, mask)
            attentions.append(probs)
        x = self.ln_final(x)
        weights = mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        logits = self.classifier(pooled)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return SequenceClassifierOutput(
            loss=loss, logits=logits, attentions=tuple(attentions) if output_attentions else None
        )


class ReferenceAdapter(Adapter):
    family = "reference"
    model_types = ("headprune-reference",)
    layers_path = "layers"

    def base_model(self, model: nn.Module) -> nn.Module:
        return model

    def attention(self, layer: HFModule) -> AttentionView:
        attn = layer.attention
        return AttentionView.of_projections(attn, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, attn.head_dim)

    def ffn(self, layer: HFModule) -> FFNView:
        return FFNView.of(layer.mlp[0], down=layer.mlp[2])

    def residual_input(self, layer: HFModule, part: str) -> HFModule | None:
        return layer if part == "attention" else layer.ln_mlp  # pre-norm

    def set_head_counts(self, view: AttentionView, num_heads: int, num_kv_heads: int) -> None:
        view.module.num_heads = num_heads

    def renumber_layers(self, model: HFModule, kept: list[int]) -> None:
        model.config.heads_per_layer = [model.config.heads_per_layer[i] for i in kept]

    def build(self, config: dict, architecture: str, options: dict | None = None) -> nn.Module:
        if architecture != "ReferenceEncoder" or options:
            raise ArchitectureError(f"unknown reference architecture {architecture!r}")
        known = set(ReferenceConfig.__dataclass_fields__)
        unknown = sorted(set(config) - known)
        if unknown:
            raise ArchitectureError(f"reference config has unknown keys: {', '.join(unknown)}")
        model = ReferenceEncoder(ReferenceConfig(**config))
        model.eval()
        return model
