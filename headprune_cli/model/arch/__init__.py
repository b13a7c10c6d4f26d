"""Registry of model-family adapters."""

from __future__ import annotations

from torch import nn

from headprune_cli.errors import ArchitectureError
from headprune_cli.model.arch.base import Adapter, AttentionView, FFNView
from headprune_cli.model.arch.bert import BertAdapter
from headprune_cli.model.arch.distilbert import DistilBertAdapter
from headprune_cli.model.arch.gemma3 import Gemma3Adapter
from headprune_cli.model.arch.gpt2 import GPT2Adapter
from headprune_cli.model.arch.llama import LlamaAdapter
from headprune_cli.model.arch.reference import ReferenceAdapter, ReferenceConfig, ReferenceEncoder
from headprune_cli.model.arch.vit import ViTAdapter
from headprune_cli.names import did_you_mean

ADAPTERS: dict[str, Adapter] = {
    a.family: a
    for a in (
        ReferenceAdapter(),
        BertAdapter(),
        DistilBertAdapter(),
        GPT2Adapter(),
        LlamaAdapter(),
        Gemma3Adapter(),
        ViTAdapter(),
    )
}


def adapter_for_family(family: str) -> Adapter:
    if family not in ADAPTERS:
        raise ArchitectureError(f"unknown model family {family!r}{did_you_mean(family, ADAPTERS)}")
    return ADAPTERS[family]


def adapter_for_model_type(model_type: str) -> Adapter:
    for adapter in ADAPTERS.values():
        if model_type in adapter.model_types:
            return adapter
    supported = sorted(t for a in ADAPTERS.values() for t in a.model_types)
    raise ArchitectureError(f"unsupported model type {model_type!r}{did_you_mean(model_type, supported)}")


def adapter_for(model: nn.Module) -> Adapter:
    return adapter_for_model_type(getattr(model.config, "model_type", type(model).__name__))


__all__ = [
    "ADAPTERS",
    "Adapter",
    "AttentionView",
    "FFNView",
    "ReferenceConfig",
    "ReferenceEncoder",
    "adapter_for",
    "adapter_for_family",
    "adapter_for_model_type",
]
