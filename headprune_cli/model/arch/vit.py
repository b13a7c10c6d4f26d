"""ViT (transformers v5 layout: q_proj/k_proj/v_proj/o_proj in `layers`)."""

from torch import nn

from headprune_cli.model.arch.base import Adapter, AttentionView, FFNView


class ViTAdapter(Adapter):
    family = "vit"
    model_types = ("vit",)
    layers_path = "layers"

    def attention(self, layer: nn.Module) -> AttentionView:
        attn = layer.attention
        return AttentionView.of_projections(attn, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, attn.head_dim)

    def ffn(self, layer: nn.Module) -> FFNView:
        return FFNView.of(layer.mlp.fc1, down=layer.mlp.fc2)

    def set_head_counts(self, view: AttentionView, num_heads: int, num_kv_heads: int) -> None:
        view.module.num_attention_heads = num_heads
