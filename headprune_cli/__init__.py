"""headprune: remove attention heads and layers from trained Transformers.

Python API:
    model = headprune_cli.load("model.safetensors")   # a torch module (transformers model for HF families)
    headprune_cli.save(model, "copy.safetensors")

Stage functions and their modules are reachable from here too (`headprune_cli.apply_plan`,
`from headprune_cli import selection`); they load on first use, so importing the package
(and running a JSON-only command such as `select`) does not import torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Public name -> (module, attribute); attribute None means the module itself.
_PUBLIC = {
    "load": ("headprune_cli.model.checkpoint", "load"),
    "save": ("headprune_cli.model.checkpoint", "save"),
    "apply_plan": ("headprune_cli.model.surgery", "apply_plan"),
    "score_model": ("headprune_cli.stages.score.importance", "score_model"),
    "select": ("headprune_cli.stages.select.strategies", "select"),
    "compensate": ("headprune_cli.stages.prune.compensation", "compensate"),
    "finetune": ("headprune_cli.stages.finetune.train", None),
    "iterative_prune": ("headprune_cli.stages.iterate.rounds", "iterative_prune"),
    "build_report": ("headprune_cli.stages.report.build", "build_report"),
    "run_sweep": ("headprune_cli.stages.sweep.ratios", "run_sweep"),
    "export_onnx": ("headprune_cli.model.formats.onnx", "export_onnx"),
    "export_hf": ("headprune_cli.model.formats.hf", "export_hf"),
    # The module names the README documented before the layout grouped them:
    "checkpoint": ("headprune_cli.model.checkpoint", None),
    "surgery": ("headprune_cli.model.surgery", None),
    "importance": ("headprune_cli.stages.score.importance", None),
    "selection": ("headprune_cli.stages.select.strategies", None),
    "compensation": ("headprune_cli.stages.prune.compensation", None),
    "iterative": ("headprune_cli.stages.iterate.rounds", None),
    "report": ("headprune_cli.stages.report.build", None),
    "sweep": ("headprune_cli.stages.sweep.ratios", None),
    "export": ("headprune_cli.model.formats.hf", None),  # export_hf, and export_onnx it calls
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'headprune_cli' has no attribute {name!r}")
    module_name, attribute = _PUBLIC[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value  # resolved once
    return value
