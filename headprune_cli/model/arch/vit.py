"""ViT (transformers v5 layout: q_proj/k_proj/v_proj/o_proj in `layers`)."""

import torch
from torch import nn

from headprune_cli.model.arch.base import Adapter, AttentionView, FFNView, HFModule, stored_config


class ViTAdapter(Adapter):
    family = "vit"
    model_types = ("vit",)
    layers_path = "layers"

    def attention(self, layer: HFModule) -> AttentionView:
        attn = layer.attention
        return AttentionView.of_projections(attn, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, attn.head_dim)

    def ffn(self, layer: HFModule) -> FFNView:
        return FFNView.of(layer.mlp.fc1, down=layer.mlp.fc2)

    def residual_input(self, layer: HFModule, part: str) -> HFModule | None:
        return layer if part == "attention" else layer.layernorm_after  # pre-norm

    def set_head_counts(self, view: AttentionView, num_heads: int, num_kv_heads: int) -> None:
        view.module.num_attention_heads = num_heads

    def sequence_length(self, model: nn.Module, seq_len: int) -> int:
        """Fixed by the image size, whatever was asked: one position per patch, plus [CLS]."""
        config = stored_config(model)
        return (config.get("image_size", 224) // config.get("patch_size", 16)) ** 2 + 1

    def example_inputs(
        self,
        model: nn.Module,
        batch: int,
        seq_len: int,
        *,
        seed: int = 0,
        first_token: int = 0,
        pad_first_row: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Random images at the config's size, in the model's dtype (no tokens, so no mask)."""
        config = stored_config(model)
        size, channels = config.get("image_size", 224), config.get("num_channels", 3)
        gen = torch.Generator().manual_seed(seed)
        pixels = torch.randn(batch, channels, size, size, generator=gen)
        return {"pixel_values": pixels.to(next(model.parameters()).dtype)}
