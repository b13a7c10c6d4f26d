"""headprune: remove attention heads and layers from trained Transformers.

Python API:
    model = headprune_cli.load("model.safetensors")   # a torch module (transformers model for HF families)
    headprune_cli.save(model, "copy.safetensors")
"""

__version__ = "0.1.0"

from headprune_cli.model.checkpoint import load, save  # noqa: E402

__all__ = ["__version__", "load", "save"]
