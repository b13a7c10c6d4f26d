"""DistilBERT."""

from torch import nn

from .base import Adapter, AttentionView


class DistilBertAdapter(Adapter):
    family = "distilbert"
    model_types = ("distilbert",)
    layers_path = "transformer.layer"

    def attention(self, layer: nn.Module) -> AttentionView:
        attn = layer.attention
        return AttentionView(
            module=attn,
            q=attn.q_lin,
            k=attn.k_lin,
            v=attn.v_lin,
            o=attn.out_lin,
            num_heads=attn.n_heads,
            num_kv_heads=attn.n_heads,
            head_dim=attn.attention_head_size,
        )

    def set_head_counts(self, view: AttentionView, num_heads: int, num_kv_heads: int) -> None:
        view.module.n_heads = num_heads
