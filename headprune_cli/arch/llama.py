"""LLaMA family: LLaMA, Mistral, Qwen2, Qwen3 (grouped-query attention)."""

from torch import nn

from .base import Adapter, AttentionView


class LlamaAdapter(Adapter):
    family = "llama"
    model_types = ("llama", "mistral", "qwen2", "qwen3")
    layers_path = "layers"

    def attention(self, layer: nn.Module) -> AttentionView:
        attn = layer.self_attn
        num_heads = attn.q_proj.out_features // attn.head_dim
        num_kv_heads = attn.k_proj.out_features // attn.head_dim
        return AttentionView(
            module=attn,
            q=attn.q_proj,
            k=attn.k_proj,
            v=attn.v_proj,
            o=attn.o_proj,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=attn.head_dim,
        )

    def set_head_counts(self, view: AttentionView, num_heads: int, num_kv_heads: int) -> None:
        # repeat_kv in eager and SDPA attention reads this to expand K/V to the query heads.
        view.module.num_key_value_groups = num_heads // num_kv_heads
