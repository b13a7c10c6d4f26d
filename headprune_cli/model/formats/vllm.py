"""Deployment to vLLM: a LLaMA-family causal LM as a Nemotron-NAS (DeciLM) folder (`export --vllm DIR`).

vLLM's `DeciLMForCausalLM` (vllm/model_executor/models/nemotron_nas.py) builds every layer from
`config.block_configs[i]`:
- attention: `no_op`, or `config.num_attention_heads` query heads (one count for every layer)
  over `num_attention_heads // n_heads_in_group` KV heads, each of `config.head_dim`;
- ffn: `no_op`, or a gated MLP of `ffn.intermediate_size` neurons, taken as it is whenever the
  block has no `ffn_mult` (only `ffn_mult` goes through DeciLM's round-up to a multiple of 256).
So a cut serves there when every kept layer keeps the same number of query heads and that
number is a whole multiple of its KV heads; KV heads and FFN widths may differ per layer, and
every FFN width is written exactly (no rounding, no zero-padding). Removed layers are absent.

vLLM 0.32 has no config class of its own for `nemotron-nas` (NVIDIA's models ship theirs,
configuration_decilm.py, with `auto_map`), and transformers does not know the type, so the
folder carries a short one too (CONFIG_FILE below: block dicts -> attribute objects, nothing
else) and is served with `trust_remote_code=True` / `--trust-remote-code`. transformers'
AutoModel finds no model class for the type and refuses the folder instead of loading it wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from headprune_cli.errors import ArchitectureError, PlanError
from headprune_cli.model.formats.hf_config import PLAIN_WEIGHTS, FolderConfig
from headprune_cli.model.layout import ModelInfo

FAMILIES = ("llama", "mistral", "qwen2")  # model_type values --vllm writes
CONFIG_MODULE = "configuration_headprune_nas"
CONFIG_CLASS = "HeadpruneNasConfig"
# The config class the folder ships (vLLM imports it under trust_remote_code). It turns each
# block's dicts into attribute objects, as nemotron_nas.py reads them, and back for to_dict.
CONFIG_FILE = '''"""Nemotron-NAS (DeciLM) config for a model pruned by headprune: per-layer blocks as vLLM's
DeciLMForCausalLM reads them (block.attention.n_heads_in_group / no_op, block.ffn.intermediate_size / no_op)."""

from types import SimpleNamespace

from transformers import PretrainedConfig


class HeadpruneNasConfig(PretrainedConfig):
    model_type = "nemotron-nas"

    def __init__(self, block_configs=(), **kwargs):
        super().__init__(**kwargs)
        self.block_configs = [
            SimpleNamespace(**{part: SimpleNamespace(**dict(fields)) for part, fields in dict(block).items()})
            if isinstance(block, dict)
            else block
            for block in block_configs
        ]

    def to_dict(self):
        out = super().to_dict()
        out["block_configs"] = [
            {part: dict(vars(fields)) for part, fields in vars(block).items()} for block in self.block_configs
        ]
        return out
'''


@dataclass
class NasPlan:
    heads: int  # query heads of every kept layer
    kv_heads: list[int]  # per kept layer
    ffn: list[int]  # per kept layer
    head_dim: int


def nas_plan(info: ModelInfo) -> NasPlan:
    """The per-layer blocks of a checkpoint, or a one-line refusal naming the layer and the rule."""
    config = info.config
    model_type = config.get("model_type")
    if info.family != "llama" or model_type not in FAMILIES or info.task != "causal-lm":
        what = f"{model_type or info.family} {info.task}"
        raise ArchitectureError(
            f"--vllm writes LLaMA-family causal LMs ({', '.join(FAMILIES)}) in vLLM's nemotron-nas format; "
            f"this checkpoint is a {what}"
        )
    _check_attention_kind(config)
    layout = info.layout
    heads = [len(h) for h in layout.heads]
    kv = [len(h) for h in layout.kv_heads]
    for pos, layer in enumerate(layout.layers):
        if heads[pos] != heads[0]:
            raise PlanError(
                f"layer {layer} keeps {heads[pos]} query heads where layer {layout.layers[0]} keeps {heads[0]}: "
                "vLLM's nemotron-nas reads one query-head count for every layer (KV heads and FFN widths may "
                "differ); choose the plan with `select --runtime vllm`"
            )
        if heads[pos] % kv[pos]:
            raise PlanError(
                f"layer {layer} keeps {heads[pos]} query heads over {kv[pos]} KV heads; "
                "vLLM needs a whole number of query heads per KV head"
            )
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    ffn = [layout.ffn_width(layer) if layout.num_ffn else config["intermediate_size"] for layer in layout.layers]
    return NasPlan(heads[0], kv, ffn, head_dim)


def _check_attention_kind(config: dict) -> None:
    """DeciLM attends over the whole context in every layer and has no q/k norms."""
    if config.get("sliding_window") and config.get("use_sliding_window", True):
        raise ArchitectureError(
            f"this model attends through a sliding window of {config['sliding_window']} tokens, which vLLM's "
            "nemotron-nas layers do not; it serves in vLLM as a --uniform plain folder (export --hf)"
        )


def nas_folder_config(info: ModelInfo, plan: NasPlan) -> FolderConfig:
    """config.json (nemotron-nas) for `info` and its `nas_plan`, as export_hf writes a folder's config."""
    config = info.config
    blocks = [
        {
            "attention": {"no_op": False, "replace_with_linear": False, "n_heads_in_group": plan.heads // kv},
            "ffn": {"no_op": False, "replace_with_linear": False, "intermediate_size": width},
        }
        for kv, width in zip(plan.kv_heads, plan.ffn)
    ]
    keep = (
        "vocab_size",
        "hidden_size",
        "hidden_act",
        "max_position_embeddings",
        "rms_norm_eps",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "attention_bias",
        "mlp_bias",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "dtype",
    )
    out = {key: config[key] for key in keep if config.get(key) is not None}
    if config.get("model_type") == "qwen2":  # q/k/v biases, no o_proj bias (DeciLM's qkv_bias switch)
        out["attention_bias"], out["qkv_bias"] = False, True
    out.update(
        {
            "architectures": ["DeciLMForCausalLM"],
            "model_type": "nemotron-nas",
            "auto_map": {"AutoConfig": f"{CONFIG_MODULE}.{CONFIG_CLASS}"},
            "num_hidden_layers": len(blocks),
            "num_attention_heads": plan.heads,
            "num_key_value_heads": plan.heads // blocks[0]["attention"]["n_heads_in_group"],
            "head_dim": plan.head_dim,
            "block_configs": blocks,
        }
    )
    return FolderConfig(out, PLAIN_WEIGHTS, plain=False, reason="a nemotron-nas folder for vLLM")
