"""What a (possibly pruned) model is: its family, original shape, and what it keeps.

Every model headprune handles carries a `ModelInfo` as `model.headprune`. The layout
speaks in original indices (layer 3, head 7 of the unpruned model) so that scores,
plans and reports stay comparable however often a model has been cut.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from torch import nn

from headprune_cli.errors import CheckpointError
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.arch.base import HFModule
from headprune_cli.ranges import MAX_FFN_NEURONS, MAX_FFN_WIDTH, from_ranges, to_ranges  # noqa: F401  (re-exported)


@dataclass
class Layout:
    num_heads: list[int]  # query heads of every original layer
    num_kv_heads: list[int]  # key/value heads of every original layer
    layers: list[int]  # original indices of the layers kept
    heads: list[list[int]]  # per kept layer: original query-head indices kept
    kv_heads: list[list[int]]  # per kept layer: original key/value-head indices kept
    # FFN width of every original layer; [] for a layout read from a file that cut no FFN
    # (the built model supplies it). Derived from the config, so not part of equality.
    num_ffn: list[int] = field(default_factory=list, compare=False)
    # original layer -> original FFN neurons kept, only for the layers whose FFN was cut
    ffn: dict[int, list[int]] = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return len(self.num_heads)

    def position(self, layer: int) -> int:
        """Where original layer `layer` sits in the current model's block list."""
        try:
            return self.layers.index(layer)
        except ValueError:
            raise CheckpointError(f"layer {layer} is not in this model (kept: {self.layers})") from None

    def ffn_width(self, layer: int) -> int:
        """How many FFN neurons original layer `layer` keeps."""
        return len(self.ffn[layer]) if layer in self.ffn else self.num_ffn[layer]

    def kept_neurons(self, layer: int) -> list[int]:
        """The original FFN neurons original layer `layer` keeps."""
        return self.ffn[layer] if layer in self.ffn else list(range(self.num_ffn[layer]))

    def to_dict(self) -> dict:
        """The stored form. The "ffn" key appears only once some layer's FFN was cut, so a
        layout without FFN cuts keeps the bytes it had before FFN pruning existed."""
        data = {k: copy.deepcopy(getattr(self, k)) for k in HEAD_KEYS}
        if self.ffn:
            data["ffn"] = {
                "width": list(self.num_ffn),
                "kept": {str(layer): to_ranges(kept) for layer, kept in sorted(self.ffn.items())},
            }
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Layout:
        try:
            layout = cls(**{k: data[k] for k in HEAD_KEYS})
        except (KeyError, TypeError) as exc:
            raise CheckpointError(f"malformed layout in checkpoint metadata: {exc}") from None
        if "ffn" in data:
            layout.num_ffn, layout.ffn = _ffn_from_dict(data["ffn"])
        layout.validate()
        return layout

    def validate(self) -> None:
        n = self.num_layers
        lists = (self.num_heads, self.num_kv_heads, self.layers, self.heads, self.kv_heads)
        if not all(isinstance(v, list) for v in lists) or not all(
            isinstance(v, list) for v in self.heads + self.kv_heads
        ):
            raise CheckpointError("checkpoint layout is malformed (its fields must be lists)")
        # Indices are plain ints: "1" or 1.0 would pass a range check and break indexing later.
        counts_ok = all(_is_int(c) and c >= 1 for c in self.num_heads + self.num_kv_heads)
        if not counts_ok or not all(_is_int(i) for i in self.layers):
            raise CheckpointError(
                "checkpoint layout is inconsistent (head counts and layer indices must be positive integers)"
            )
        ok = (
            len(self.num_kv_heads) == n
            and len(self.heads) == len(self.layers) == len(self.kv_heads)
            and sorted(set(self.layers)) == self.layers
            and all(0 <= i < n for i in self.layers)
        )
        for pos, layer in enumerate(self.layers if ok else []):
            heads, kv = self.heads[pos], self.kv_heads[pos]
            ok = ok and _is_index_set(heads, self.num_heads[layer]) and _is_index_set(kv, self.num_kv_heads[layer])
            ok = ok and len(heads) >= 1 and len(kv) >= 1
        if not ok:
            raise CheckpointError("checkpoint layout is inconsistent (layer or head indices out of range)")
        self._validate_ffn()

    def _validate_ffn(self) -> None:
        if not self.num_ffn and not self.ffn:
            return
        if len(self.num_ffn) != self.num_layers or not all(_is_int(w) and w >= 1 for w in self.num_ffn):
            raise CheckpointError(
                "checkpoint layout is inconsistent (FFN widths must be one positive integer per layer)"
            )
        for layer, kept in self.ffn.items():
            if layer not in self.layers:
                raise CheckpointError(
                    f"checkpoint layout is inconsistent (FFN neurons listed for layer {layer}, which it does not keep)"
                )
            if not kept or not _is_index_set(kept, self.num_ffn[layer]) or len(kept) == self.num_ffn[layer]:
                raise CheckpointError(
                    f"checkpoint layout is inconsistent (FFN neurons of layer {layer} out of range, or none cut)"
                )


HEAD_KEYS = ("num_heads", "num_kv_heads", "layers", "heads", "kv_heads")


def _ffn_from_dict(data) -> tuple[list[int], dict[int, list[int]]]:
    """The stored "ffn" layout key: {"width": [per original layer], "kept": {layer: runs}}."""
    bad = CheckpointError("malformed FFN layout in checkpoint metadata")
    if not isinstance(data, dict) or set(data) != {"width", "kept"} or not isinstance(data["kept"], dict):
        raise bad
    widths = data["width"]
    if not isinstance(widths, list) or not all(_is_int(w) and 1 <= w <= MAX_FFN_WIDTH for w in widths):
        raise bad
    if sum(widths) > MAX_FFN_NEURONS:  # bounds what the runs below may expand to
        raise bad
    kept: dict[int, list[int]] = {}
    for key, runs in data["kept"].items():
        if not (key.isascii() and key.isdigit() and str(int(key)) == key and int(key) < len(widths)):
            raise bad
        indices = from_ranges(runs, widths[int(key)])
        if indices is None:
            raise bad
        kept[int(key)] = indices
    return list(widths), kept


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_index_set(values: list, bound: int) -> bool:
    return all(_is_int(v) for v in values) and values == sorted(set(values)) and all(0 <= v < bound for v in values)


@dataclass
class ModelInfo:
    family: str
    architecture: str  # class name that rebuilds the unpruned model
    config: dict  # the unpruned model's config
    layout: Layout
    task: str  # classification | causal-lm | embedding
    tokenizer: str | None = None  # tokenizer.json text
    tokenizer_config: dict = field(default_factory=dict)  # special tokens, max length
    pooling: dict = field(default_factory=dict)  # sentence-transformers pooling, for embeddings
    provenance: dict = field(default_factory=lambda: {"parent": None, "plan": None, "root": None})
    build_options: dict = field(default_factory=dict)  # constructor options, e.g. add_pooling_layer
    loaded_from: tuple[str, str] | None = None  # (path, sha256) of the file it came from; not stored

    @property
    def source_sha(self) -> str:
        """sha256 of the file the model was read from, for a stage that loaded it (checkpoint.load)."""
        assert self.loaded_from is not None, "the model was not read from a file"  # a stage's bug, not bad input
        return self.loaded_from[1]


def full_layout(model: nn.Module) -> Layout:
    """The layout of an unpruned model: every layer and head kept."""
    adapter = adapter_for(model)
    blocks = adapter.layer_list(model)
    views = [adapter.attention(layer) for layer in blocks]
    return Layout(
        num_heads=[v.num_heads for v in views],
        num_kv_heads=[v.num_kv_heads for v in views],
        layers=list(range(len(views))),
        heads=[list(range(v.num_heads)) for v in views],
        kv_heads=[list(range(v.num_kv_heads)) for v in views],
        num_ffn=[adapter.ffn(layer).width for layer in blocks],
    )


def default_task(model: nn.Module) -> str:
    name = type(model).__name__
    if name.endswith("ForCausalLM") or name.endswith("LMHeadModel"):
        return "causal-lm"
    if "Classification" in name or name == "ReferenceEncoder":
        return "classification"
    return "embedding"


def _build_options(model: nn.Module) -> dict:
    """Constructor options a rebuild needs: a base model built without its pooler."""
    if getattr(model, "pooler", "absent") is None:
        return {"add_pooling_layer": False}
    return {}


def info_of(model: HFModule) -> ModelInfo:
    """The model's ModelInfo, created on first use for a model built in Python."""
    info = getattr(model, "headprune", None)
    if info is None:
        adapter = adapter_for(model)
        info = ModelInfo(
            family=adapter.family,
            architecture=type(model).__name__,
            config=copy.deepcopy(model.config.to_dict()),
            layout=full_layout(model),
            task=default_task(model),
            build_options=_build_options(model),
        )
        model.headprune = info
    return info
