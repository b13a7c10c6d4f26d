"""The one model view everything else sits on.

An adapter knows, for one model family, where the attention blocks are and which
attributes its forward reads, and answers what the rest of headprune would otherwise ask
the family name: example inputs for (batch, seq_len), the positions a forward covers, the
head size, whether its causal LMs keep a KV cache and whether its config states
head_dim. Everything generic (gating, head removal, layer removal,
cost counting) is written once, here and in `surgery.py`, against that view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headprune_cli.errors import ArchitectureError

# A transformers block or projection reached by its attribute names (layer.self_attn.q_proj,
# model.config): nn.Module.__getattr__ types every such name as Tensor | Module, true of none
# that the adapters read, so what they walk by name is typed Any rather than cast at each step.
HFModule = Any


@dataclass
class AttentionView:
    """The parts of one layer's self-attention that head pruning touches."""

    module: HFModule  # the attention module whose head-count attributes we update
    q: HFModule | None  # None when Q/K/V are one fused projection (GPT-2)
    k: HFModule | None
    v: HFModule | None
    o: HFModule  # output projection; its input is the concatenation of head outputs
    num_heads: int
    num_kv_heads: int
    head_dim: int
    fused_qkv: HFModule | None = None

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def of_projections(cls, module: nn.Module, q, k, v, o, head_dim: int) -> AttentionView:
        """A view of separate Q/K/V/O projections; head counts come from their shapes."""
        return cls(
            module=module,
            q=q,
            k=k,
            v=v,
            o=o,
            head_dim=head_dim,
            num_heads=q.out_features // head_dim,
            num_kv_heads=k.out_features // head_dim,
        )


@dataclass
class FFNView:
    """One layer's feed-forward block as neuron pruning sees it: `ups` are the projections
    whose output features are the neurons (up, and gate for gated MLPs), `down` the one
    whose input features are the neurons."""

    ups: list[HFModule]
    down: HFModule
    width: int

    @classmethod
    def of(cls, *ups: HFModule, down: HFModule) -> FFNView:
        width = down.weight.shape[0] if is_conv1d(down) else down.in_features
        return cls(ups=list(ups), down=down, width=width)


def hidden_states_in(args: tuple, kwargs: dict) -> torch.Tensor:
    """A block's (or norm's) hidden-state input as a forward hook with kwargs sees it: the first
    positional argument, or `hidden_states=` (transformers calls its decoder layers so)."""
    return args[0] if args else kwargs["hidden_states"]


def out_rows(head_indices: list[int], head_dim: int) -> torch.Tensor:
    """Feature indices that belong to the given heads in a [heads * head_dim] axis."""
    rows = [h * head_dim + i for h in head_indices for i in range(head_dim)]
    return torch.tensor(rows, dtype=torch.long)


def is_conv1d(module: nn.Module) -> bool:
    # transformers' Conv1D stores weight as [in, out] (transposed w.r.t. nn.Linear).
    return type(module).__name__ == "Conv1D"


def sliced_dims(module: HFModule, side: str) -> dict[str, int]:
    """The parameter dimensions that keeping some outputs ("out") or inputs ("in") cuts."""
    if side == "out":
        return {"weight": 1 if is_conv1d(module) else 0, **({"bias": 0} if module.bias is not None else {})}
    return {"weight": 0 if is_conv1d(module) else 1}


def keep_outputs(module: HFModule, index: torch.Tensor) -> None:
    """Keep only the given output features of a Linear/Conv1D, in place."""
    with torch.no_grad():
        if is_conv1d(module):
            module.weight = nn.Parameter(module.weight[:, index].clone())
            module.nf = len(index)
        else:
            module.weight = nn.Parameter(module.weight[index].clone())
            module.out_features = len(index)
        if module.bias is not None:
            module.bias = nn.Parameter(module.bias[index].clone())


def keep_inputs(module: HFModule, index: torch.Tensor) -> None:
    """Keep only the given input features of a Linear/Conv1D, in place."""
    with torch.no_grad():
        if is_conv1d(module):
            module.weight = nn.Parameter(module.weight[index, :].clone())
            module.nx = len(index)
        else:
            module.weight = nn.Parameter(module.weight[:, index].clone())
            module.in_features = len(index)


class Adapter:
    """Base adapter. Subclasses name their family and locate the attention parts."""

    family: str = ""
    model_types: tuple[str, ...] = ()  # Hugging Face `config.model_type` values served

    layers_path: str = ""  # dotted path of the block list, from the base model
    keeps_kv_cache: bool = False  # its causal LMs decode with past keys/values (ONNX export writes them)
    explicit_head_dim: bool = False  # its transformers config states head_dim, so it can state pruned head counts

    # --- locating -------------------------------------------------------------
    def base_model(self, model: nn.Module) -> nn.Module:
        return getattr(model, "base_model", model)

    def _layers_parent(self, model: nn.Module) -> tuple[nn.Module, str]:
        parent = self.base_model(model)
        *path, name = self.layers_path.split(".")
        for part in path:
            parent = getattr(parent, part)
        return parent, name

    def layer_list(self, model: nn.Module) -> nn.ModuleList:
        parent, name = self._layers_parent(model)
        return getattr(parent, name)

    def set_layer_list(self, model: nn.Module, layers: nn.ModuleList) -> None:
        parent, name = self._layers_parent(model)
        setattr(parent, name, layers)

    def attention(self, layer: HFModule) -> AttentionView:
        raise NotImplementedError

    def set_head_counts(self, view: AttentionView, num_heads: int, num_kv_heads: int) -> None:
        """Update whatever head-count attributes the family's forward reads."""
        raise NotImplementedError

    def residual_input(self, layer: HFModule, part: str) -> HFModule | None:
        """The module of `layer` whose hidden-state input is the residual stream that the
        output projection of `part` ("attention" | "ffn") is added to, unnormalised; None
        where a norm sits between the projection and the addition. Compensation fits that
        sum, so it must know where the stream is. For attention it is the block's own input
        in every family here (pre-norm and post-norm alike); None by default for the FFN."""
        return layer if part == "attention" else None

    def ffn(self, layer: HFModule) -> FFNView:
        raise NotImplementedError

    # --- generic slicing, overridden only for fused projections ----------------
    def head_slices(
        self, view: AttentionView, keep_q: list[int], keep_kv: list[int]
    ) -> list[tuple[HFModule, str, torch.Tensor]]:
        """Which projections keep which features when a layer keeps the given (current,
        0-based) heads: (module, "out" | "in", feature index). The one statement of where
        heads live in the tensors, shared by in-memory surgery and streamed pruning."""
        q_index = out_rows(keep_q, view.head_dim)
        kv_index = out_rows(keep_kv, view.head_dim)
        return [(view.q, "out", q_index), (view.k, "out", kv_index), (view.v, "out", kv_index), (view.o, "in", q_index)]

    def slice_heads(self, view: AttentionView, keep_q: list[int], keep_kv: list[int]) -> None:
        """Keep the given (current, 0-based) query and key/value heads of one layer."""
        for module, side, index in self.head_slices(view, keep_q, keep_kv):
            (keep_outputs if side == "out" else keep_inputs)(module, index)
        self.set_head_counts(view, len(keep_q), len(keep_kv))

    def ffn_slices(self, view: FFNView, keep: list[int] | torch.Tensor) -> list[tuple[HFModule, str, torch.Tensor]]:
        """Which projections keep which features when a layer keeps the given (current,
        0-based) FFN neurons: every up/gate projection's outputs, the down projection's inputs."""
        index = torch.as_tensor(keep, dtype=torch.long)
        return [*((up, "out", index) for up in view.ups), (view.down, "in", index)]

    def slice_ffn(self, view: FFNView, keep: list[int]) -> None:
        """Keep the given (current, 0-based) FFN neurons of one layer. No family's MLP
        forward reads its width from an attribute, so the tensors are all there is to cut."""
        for module, side, index in self.ffn_slices(view, keep):
            (keep_outputs if side == "out" else keep_inputs)(module, index)

    def renumber_layers(self, model: HFModule, kept: list[int]) -> None:
        """After blocks were dropped: fix config and everything indexed by layer."""
        config = model.config
        config.num_hidden_layers = len(kept)
        layer_types = getattr(config, "layer_types", None)
        if layer_types is not None:
            config.layer_types = [layer_types[i] for i in kept]
        layer: HFModule
        for new_index, layer in enumerate(self.layer_list(model)):
            attn = self.attention(layer).module
            if hasattr(attn, "layer_idx"):
                attn.layer_idx = new_index
            if hasattr(layer, "layer_idx"):
                layer.layer_idx = new_index

    # --- family facts -------------------------------------------------------------
    def head_dim(self, model: nn.Module) -> int:
        """Features per head; every layer has the same (pruning removes heads, never narrows one)."""
        return self.attention(self.layer_list(model)[0]).head_dim

    def max_positions(self, model: nn.Module) -> int | None:
        """The most tokens the model can take (its position table), when its config says."""
        config = stored_config(model)
        for key in ("max_position_embeddings", "n_positions", "max_position"):
            value = config.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    def sequence_length(self, model: nn.Module, seq_len: int) -> int:
        """The positions a forward pass runs over when `seq_len` tokens are asked for."""
        return seq_len

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
        """Random inputs of the family's kind for `batch` rows of `seq_len` tokens.

        Token ids are drawn from [first_token, vocab) (capped below the vocabulary size);
        with `pad_first_row` the first row's last two positions are padding (when there are
        more than two), so the attention mask's path runs too.
        """
        gen = torch.Generator().manual_seed(seed)
        vocab = int(stored_config(model).get("vocab_size", 2))
        ids = torch.randint(min(first_token, vocab - 1), vocab, (batch, seq_len), generator=gen)
        mask = torch.ones_like(ids)
        if pad_first_row and seq_len > 2:
            mask[0, -2:] = 0
        return {"input_ids": ids, "attention_mask": mask}

    # --- construction -----------------------------------------------------------
    def build(self, config: dict, architecture: str, options: dict | None = None) -> nn.Module:
        """Build an unpruned model of the stored architecture from its config."""
        return build_transformers_model(config, architecture, self.model_types, options or {})


def stored_config(model: HFModule) -> dict:
    """The model's config as headprune stores it: the checkpoint's (layout.ModelInfo), or for a
    model built in Python, its own (what layout.info_of would record)."""
    info = getattr(model, "headprune", None)
    return info.config if info is not None else model.config.to_dict()


BUILD_OPTIONS = {"add_pooling_layer": bool}  # the only constructor options a checkpoint may set


def build_transformers_model(
    config: dict, architecture: str, model_types: tuple[str, ...], options: dict | None = None
) -> nn.Module:
    """Instantiate a transformers class by name, never with remote code."""
    import transformers  # noqa: PLC0415 (keeps transformers out of this module's import)

    model_type = config.get("model_type")
    if model_type not in model_types:
        raise ArchitectureError(f"config model_type {model_type!r} does not belong to this family")
    cls = getattr(transformers, architecture, None)
    if cls is None or not isinstance(cls, type) or not issubclass(cls, transformers.PreTrainedModel):
        raise ArchitectureError(f"unknown transformers architecture {architecture!r}")
    fields = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version", "architectures")}
    options = options or {}
    for key, value in options.items():
        if not isinstance(value, BUILD_OPTIONS.get(key, type(None))):
            raise ArchitectureError(f"unsupported build option {key}={value!r}")
    hf_config = transformers.AutoConfig.for_model(model_type, **fields)
    model = cls(hf_config, **options)
    model.eval()
    return model
