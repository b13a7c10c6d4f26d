"""ViT (transformers v5 layout: q_proj/k_proj/v_proj/o_proj in `layers`)."""

from torch import nn

from .base import Adapter, AttentionView


class ViTAdapter(Adapter):
    family = "vit"
    model_types = ("vit",)
    layers_path = "layers"

    def attention(self, layer: nn.Module) -> AttentionView:
        attn = layer.attention
        return AttentionView(
            module=attn,
            q=attn.q_proj,
            k=attn.k_proj,
            v=attn.v_proj,
            o=attn.o_proj,
            num_heads=attn.q_proj.out_features // attn.head_dim,
            num_kv_heads=attn.q_proj.out_features // attn.head_dim,
            head_dim=attn.head_dim,
        )

    def set_head_counts(self, view: AttentionView, num_heads: int, num_kv_heads: int) -> None:
        view.module.num_attention_heads = num_heads
