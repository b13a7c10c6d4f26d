"""DistilBERT."""

from headprune_cli.model.arch.base import Adapter, AttentionView, FFNView, HFModule


class DistilBertAdapter(Adapter):
    family = "distilbert"
    model_types = ("distilbert",)
    layers_path = "transformer.layer"

    def attention(self, layer: HFModule) -> AttentionView:
        attn = layer.attention
        return AttentionView.of_projections(
            attn, attn.q_lin, attn.k_lin, attn.v_lin, attn.out_lin, attn.attention_head_size
        )

    def ffn(self, layer: HFModule) -> FFNView:
        return FFNView.of(layer.ffn.lin1, down=layer.ffn.lin2)

    def residual_input(self, layer: HFModule, part: str) -> HFModule | None:
        # Post-norm: the FFN's output is added to sa_output, the FFN's own input.
        return layer if part == "attention" else layer.ffn

    def set_head_counts(self, view: AttentionView, num_heads: int, num_kv_heads: int) -> None:
        view.module.n_heads = num_heads
