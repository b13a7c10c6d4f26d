"""Gemma 3 (text): grouped-query attention with per-head q/k RMSNorms, sliding-window layers.

What head and layer cuts must respect, and why they are exact here:
- q_norm / k_norm normalise each head's head_dim features with one weight shared by all
  heads, so slicing whole heads out of Q/K leaves them unchanged.
- Each layer is sliding-window or full attention by `config.layer_types[i]`, which the text
  model reads by position at every forward (mask and RoPE base); `renumber_layers` keeps that
  list aligned with the kept layers, so every kept layer keeps its own kind.
- The attention scale comes from `query_pre_attn_scalar`, not the head count: removing query
  heads changes no other head's output.
"""

from headprune_cli.model.arch.base import HFModule
from headprune_cli.model.arch.llama import LlamaAdapter


class Gemma3Adapter(LlamaAdapter):
    """LLaMA's projections, FFN and head-count attribute under another family name: what differs
    (the shared q/k norms, the layer kinds) needs nothing from the adapter (see above)."""

    family = "gemma3"
    model_types = ("gemma3_text",)

    def residual_input(self, layer: HFModule, part: str) -> HFModule | None:
        # post_attention_layernorm and post_feedforward_layernorm normalise each projection's
        # output before it is added: no linear fit of the sum exists.
        return None
