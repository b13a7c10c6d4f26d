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

# Public name -> (module, attribute); attribute None means the module itself. This table is the
# library's public surface: README's Python API, notebooks and scripts/benchmarks use these names
# only (tests/test_layout.py enforces it for the benchmarks), so internal modules can move freely as
# long as this table follows them.
_PUBLIC = {
    # checkpoints and models
    "load": ("headprune_cli.model.checkpoint", "load"),
    "save": ("headprune_cli.model.checkpoint", "save"),
    "import_folder": ("headprune_cli.model.importer", "import_folder"),
    "info_of": ("headprune_cli.model.layout", "info_of"),
    "flops_per_token": ("headprune_cli.model.cost", "flops_per_token"),
    "count_params": ("headprune_cli.model.cost", "count_params"),
    "predict_cost": ("headprune_cli.model.cost_table", "predict"),
    "apply_plan": ("headprune_cli.model.surgery", "apply_plan"),
    "prune_file": ("headprune_cli.model.streaming", "prune_file"),  # file to file, one tensor at a time
    # every stage as a library call: run_stage("score", checkpoint=..., data=..., output=...)
    "run_stage": ("headprune_cli.stages.unit", "run_stage"),
    # data and metrics
    "Dataset": ("headprune_cli.data.readers", "Dataset"),
    "read_data": ("headprune_cli.data.readers", "read_data"),
    "batches": ("headprune_cli.data.readers", "batches"),
    "evaluate": ("headprune_cli.stages.objectives", "evaluate"),
    "embed": ("headprune_cli.stages.objectives", "embed"),
    "cosine": ("headprune_cli.stages.objectives", "cosine"),
    # the fidelity objective's first-order surrogate: a seeded random projection of each output
    "probe_loss": ("headprune_cli.stages.score.importance.gradients", "probe_loss"),
    # importance, selection, compensation
    "score_model": ("headprune_cli.stages.score.importance", "score_model"),
    "scores_artifact": ("headprune_cli.stages.score.importance", "scores_artifact"),
    "ScoreTable": ("headprune_cli.stages.score.table", "ScoreTable"),
    "Scores": ("headprune_cli.artifacts.schema", "Scores"),
    "read_artifact": ("headprune_cli.artifacts.schema", "read_artifact"),
    "Budget": ("headprune_cli.stages.budget", "Budget"),
    "Constraints": ("headprune_cli.stages.constraints", "Constraints"),
    "select": ("headprune_cli.stages.select.strategies", "select"),
    "compensate": ("headprune_cli.stages.prune.compensation", "compensate"),
    "iterative_prune": ("headprune_cli.stages.iterate.rounds", "iterative_prune"),
    "schedule_of": ("headprune_cli.stages.iterate.schedule", "schedule_of"),
    # recovery: train(model, data, FinetuneConfig(...), teacher=...) is finetune's loop in memory
    "train": ("headprune_cli.stages.training.train", "finetune"),
    "FinetuneConfig": ("headprune_cli.stages.training.train", "FinetuneConfig"),
    "default_lr": ("headprune_cli.stages.training.train", "default_lr"),
    "rewind": ("headprune_cli.stages.finetune.rewind", "rewind"),
    "reinit": ("headprune_cli.stages.finetune.rewind", "reinit"),
    # speed: latency of a forward, and the serving (prefill / decode) measurements report makes
    "measure_latency": ("headprune_cli.stages.model_latency", "measure"),
    "synthetic_inputs": ("headprune_cli.stages.model_latency", "synthetic_inputs"),
    "max_sequence": ("headprune_cli.stages.model_latency", "max_sequence"),
    "LatencyTable": ("headprune_cli.model.latency_table", "LatencyTable"),
    "layout_counts": ("headprune_cli.stages.profile.build", "layout_counts"),
    # export and the shipped formats
    "export_onnx": ("headprune_cli.model.formats.onnx", "export_onnx"),
    "export_hf": ("headprune_cli.model.formats.hf", "export_hf"),
    "export_quantized": ("headprune_cli.model.formats.onnx_quantize", "export_quantized"),
    "export_gguf": ("headprune_cli.stages.export.gguf_file", "write_gguf"),  # checkpoint file -> GGUF file
    "gguf_decode_bytes": ("headprune_cli.model.formats.gguf_cost", "decode_bytes"),
    "OnnxModel": ("headprune_cli.stages.report.shipped", "OnnxModel"),
    "build_report": ("headprune_cli.stages.report.build", "build_report"),
    "run_sweep": ("headprune_cli.stages.sweep.loop", "run_sweep"),
    "UsageError": ("headprune_cli.errors", "UsageError"),
    # modules: the training loop, the serving measurements, losses and metrics
    "finetune": ("headprune_cli.stages.training.train", None),
    "serving": ("headprune_cli.stages.report.serving", None),
    "latency": ("headprune_cli.stages.model_latency", None),
    "objectives": ("headprune_cli.stages.objectives", None),
    # The module names the README documented before the layout grouped them:
    "checkpoint": ("headprune_cli.model.checkpoint", None),
    "surgery": ("headprune_cli.model.surgery", None),
    "importance": ("headprune_cli.stages.score.importance", None),
    "selection": ("headprune_cli.stages.select.strategies", None),
    "compensation": ("headprune_cli.stages.prune.compensation", None),
    "iterative": ("headprune_cli.stages.iterate.rounds", None),
    "report": ("headprune_cli.stages.report.build", None),
    "sweep": ("headprune_cli.stages.sweep.loop", None),
    "export": ("headprune_cli.model.formats.hf", None),
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
