"""LLaMA family: LLaMA, Mistral, Qwen2, Qwen3 (grouped-query attention)."""

from headprune_cli.model.arch.base import Adapter, AttentionView, FFNView, HFModule


class LlamaAdapter(Adapter):
    family = "llama"
    model_types: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3")
    layers_path = "layers"
    keeps_kv_cache = True
    explicit_head_dim = True  # LLaMA, Mistral and Qwen configs take head_dim

    def attention(self, layer: HFModule) -> AttentionView:
        attn = layer.self_attn
        return AttentionView.of_projections(attn, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, attn.head_dim)

    def ffn(self, layer: HFModule) -> FFNView:
        return FFNView.of(layer.mlp.gate_proj, layer.mlp.up_proj, down=layer.mlp.down_proj)

    def residual_input(self, layer: HFModule, part: str) -> HFModule | None:
        # Pre-norm: the FFN's residual is what enters post_attention_layernorm.
        return layer if part == "attention" else layer.post_attention_layernorm

    def set_head_counts(self, view: AttentionView, num_heads: int, num_kv_heads: int) -> None:
        # repeat_kv in eager and SDPA attention reads this to expand K/V to the query heads.
        view.module.num_key_value_groups = num_heads // num_kv_heads
