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

from headprune_cli.model.arch.base import Adapter, AttentionView, FFNView, HFModule


class Gemma3Adapter(Adapter):
    family = "gemma3"
    model_types = ("gemma3_text",)
    layers_path = "layers"
    keeps_kv_cache = True
    explicit_head_dim = True

    def attention(self, layer: HFModule) -> AttentionView:
        attn = layer.self_attn
        return AttentionView.of_projections(attn, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, attn.head_dim)

    def ffn(self, layer: HFModule) -> FFNView:
        return FFNView.of(layer.mlp.gate_proj, layer.mlp.up_proj, down=layer.mlp.down_proj)

    def set_head_counts(self, view: AttentionView, num_heads: int, num_kv_heads: int) -> None:
        # repeat_kv in eager and SDPA attention reads this to expand K/V to the query heads.
        view.module.num_key_value_groups = num_heads // num_kv_heads
