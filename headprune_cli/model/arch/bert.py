"""BERT family: BERT, RoBERTa, MiniLM (a BERT), ELECTRA, XLM-R."""

from headprune_cli.model.arch.base import Adapter, AttentionView, FFNView, HFModule


class BertAdapter(Adapter):
    family = "bert"
    model_types = ("bert", "roberta", "electra", "xlm-roberta")
    layers_path = "encoder.layer"

    def attention(self, layer: HFModule) -> AttentionView:
        attn = layer.attention.self
        return AttentionView.of_projections(
            attn, attn.query, attn.key, attn.value, layer.attention.output.dense, attn.attention_head_size
        )

    def ffn(self, layer: HFModule) -> FFNView:
        return FFNView.of(layer.intermediate.dense, down=layer.output.dense)

    def residual_input(self, layer: HFModule, part: str) -> HFModule | None:
        # Post-norm: BertOutput adds the FFN's output to the attention output, its own input.
        return layer if part == "attention" else layer.intermediate.dense

    def set_head_counts(self, view: AttentionView, num_heads: int, num_kv_heads: int) -> None:
        view.module.num_attention_heads = num_heads
        view.module.all_head_size = num_heads * view.head_dim
