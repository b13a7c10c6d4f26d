"""GPT-2: one fused Conv1D for Q, K and V (weights stored [in, out])."""

import torch

from headprune_cli.errors import ArchitectureError
from headprune_cli.model.arch.base import Adapter, AttentionView, FFNView, HFModule, out_rows


class GPT2Adapter(Adapter):
    family = "gpt2"
    model_types = ("gpt2",)
    layers_path = "h"
    keeps_kv_cache = True

    def attention(self, layer: HFModule) -> AttentionView:
        attn = layer.attn
        if getattr(attn, "is_cross_attention", False):
            raise ArchitectureError("GPT-2 cross-attention layers are not supported")
        return AttentionView(
            module=attn,
            q=None,
            k=None,
            v=None,
            o=attn.c_proj,
            num_heads=attn.num_heads,
            num_kv_heads=attn.num_heads,
            head_dim=attn.head_dim,
            fused_qkv=attn.c_attn,
        )

    def head_slices(self, view: AttentionView, keep_q: list[int], keep_kv: list[int]) -> list:
        # c_attn's output is [Q | K | V], each block `split_size` wide.
        width = view.num_heads * view.head_dim
        rows = out_rows(keep_q, view.head_dim)
        fused = torch.cat([rows, rows + width, rows + 2 * width])
        return [(view.fused_qkv, "out", fused), (view.o, "in", rows)]

    def ffn(self, layer: HFModule) -> FFNView:
        return FFNView.of(layer.mlp.c_fc, down=layer.mlp.c_proj)

    def residual_input(self, layer: HFModule, part: str) -> HFModule | None:
        return layer if part == "attention" else layer.ln_2  # pre-norm

    def set_head_counts(self, view: AttentionView, num_heads: int, num_kv_heads: int) -> None:
        view.module.num_heads = num_heads
        view.module.split_size = num_heads * view.head_dim
