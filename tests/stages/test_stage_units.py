"""The finetune, report, export and import stages called as units (options -> run ->
Result), the way `headprune run` calls them: no typer, exit codes as values, messages
and progress on the context's console; and the defaults the options share with the
library agree."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
import torch
from rich.console import Console

from headprune_cli import load
from headprune_cli.errors import CheckpointError, UsageError
from headprune_cli.files.io import sha256_file
from headprune_cli.stages import objectives
from headprune_cli.stages.export import stage as export_stage
from headprune_cli.stages.finetune import stage as finetune_stage
from headprune_cli.stages.import_ import stage as import_stage
from headprune_cli.stages.learn import stage as learn_stage
from headprune_cli.stages.report import stage as report_stage
from headprune_cli.stages.training.train import FinetuneConfig, finetune
from headprune_cli.stages.unit import Context
from tests.support import TINY, VOCAB

FAST_REPORT = {"seq_len": 8, "repeats": 1, "warmup": 0, "batch_size": 8}


def _context(progress: bool = True) -> tuple[Context, io.StringIO]:
    text = io.StringIO()
    return Context(Console(file=text, width=200), progress=progress), text


# --- which way a metric improves: one table ---------------------------------------
def test_each_metric_states_its_direction_and_an_unknown_one_is_refused():
    assert [objectives.metric(n, 1.0).higher_is_better for n in ("accuracy", "macro_f1", "fidelity", "perplexity")] == [
        True,
        True,
        True,
        False,
    ]
    with pytest.raises(UsageError, match="'bleu' has no known direction"):
        objectives.higher_is_better("bleu")


def _rows():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, VOCAB, (16, 8), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids[:, 0] % 2}


@pytest.mark.parametrize(("name", "best"), [("perplexity", 1), ("accuracy", 0)])
def test_finetune_keeps_the_best_epoch_by_the_metrics_own_direction(name, best):
    """No direction given: perplexity 0.3 (epoch 1) is best, accuracy 0.9 (before training) is."""
    scores = iter([0.9, 0.3, 0.5])
    result = finetune(
        TINY["reference"](),
        _rows(),
        FinetuneConfig(epochs=2, lr=1e-3, batch_size=16),
        eval_fn=lambda m: {name: next(scores)},
    )
    assert result.best_epoch == best


def test_finetune_refuses_a_metric_of_unknown_direction_before_training():
    steps = []
    with pytest.raises(UsageError, match="'bleu' has no known direction"):
        finetune(
            TINY["reference"](),
            _rows(),
            FinetuneConfig(steps=2, lr=1e-3),
            eval_fn=lambda m: {"bleu": 1.0},
            on_step=lambda *args: steps.append(args),
        )
    assert steps == []
    # Said explicitly, any metric goes.
    result = finetune(
        TINY["reference"](),
        _rows(),
        FinetuneConfig(steps=1, lr=1e-3),
        eval_fn=lambda m: {"bleu": 1.0},
        higher_is_better=False,
    )
    assert result.best_epoch == 0


# --- the options' defaults are the library's ----------------------------------------
def _shared_defaults(options, library) -> dict:
    shared = {f.name: f.default for f in dataclasses.fields(library) if f.name in options.model_fields}
    return {name: (options.model_fields[name].default, default) for name, default in shared.items()}


def test_stage_defaults_agree_with_the_library_dataclasses():
    from headprune_cli.model.tensorfile import DEFAULT_MAX_SHARD
    from headprune_cli.stages.report.settings import CONFIG_KEYS, ReportSettings

    # Training and the report read the stages' options themselves: every field is one declaration.
    assert issubclass(finetune_stage.FinetuneOptions, FinetuneConfig)
    assert issubclass(report_stage.ReportStageOptions, ReportSettings)
    assert set(CONFIG_KEYS) == set(ReportSettings.model_fields) - {"engine_python"}
    # learn trains with the same loop: its training options are the loop's own declarations
    from headprune_cli.stages.options import TrainingOptions

    assert issubclass(learn_stage.LearnOptions, TrainingOptions) and issubclass(FinetuneConfig, TrainingOptions)
    assert not set(learn_stage.LearnOptions.model_fields) & {"state_dir", "save_every", "resume", "fsdp"}
    # A table profiled with the defaults compares with a report run with the defaults.
    from headprune_cli.stages.profile.build import DEFAULT_SEQ_LEN as PROFILE_SEQ
    from headprune_cli.stages.profile.stage import ProfileOptions
    from headprune_cli.stages.report.build import DEFAULT_SEQ_LEN as REPORT_SEQ

    for name in ("batch_size", "threads", "device", "dtype"):
        assert (
            ProfileOptions.model_fields[name].default == report_stage.ReportStageOptions.model_fields[name].default
        ), name
    assert PROFILE_SEQ == REPORT_SEQ
    assert export_stage.ExportOptions.model_fields["max_shard_size"].default == DEFAULT_MAX_SHARD


# --- report ----------------------------------------------------------------------------
def test_a_failed_gate_is_exit_code_3_after_every_output_is_written(pruned):
    folder = pruned.parent
    opts = report_stage.ReportStageOptions(
        model=pruned,
        data=folder / "dev.safetensors",
        min_speedup=1e6,
        json_out=str(folder / "r.json"),
        markdown_out=folder / "r.md",
        junit_out=folder / "r.xml",
        **FAST_REPORT,
    )
    ctx, text = _context()
    result = report_stage.run(opts, ctx)
    assert result.exit_code == 3
    assert result.outputs == [str(folder / "r.json"), str(folder / "r.md"), str(folder / "r.xml")]
    report = json.loads((folder / "r.json").read_text())
    assert report["verdict"] == result.value["verdict"] == "fail" and report["gates"] == result.value["gates"]
    assert report["config"]["min_speedup"] == 1e6 and report["config"]["baseline"] == "auto"
    assert list(report["config"])[:3] == ["batch_size", "seq_len", "threads"]  # ReportOptions' order: the bytes stay
    assert "min-speedup" in (folder / "r.xml").read_text()
    assert text.getvalue().splitlines()[-1].startswith("FAIL: gate min-speedup failed: ")


def test_a_report_without_gates_is_exit_code_0(pruned):
    folder = pruned.parent
    opts = report_stage.ReportStageOptions(model=pruned, data=folder / "dev.safetensors", **FAST_REPORT)
    result = report_stage.run(opts, _context()[0])
    assert result.exit_code == 0 and result.outputs == [] and result.value["verdict"] == "no-gates"


def test_report_refuses_a_speed_gate_without_timing_before_any_work(pruned):
    opts = report_stage.ReportStageOptions(
        model=pruned,
        data=pruned.parent / "dev.safetensors",
        min_speedup=1.0,
        repeats=0,
        json_out=str(pruned.parent / "r.json"),
    )
    with pytest.raises(UsageError, match="--min-speedup needs latency"):
        report_stage.run(opts, _context()[0])
    assert not (pruned.parent / "r.json").exists()


# --- finetune --------------------------------------------------------------------------
@pytest.mark.parametrize("progress", [True, False])
def test_finetune_run_writes_the_model_and_shows_its_table_with_or_without_a_bar(pruned, progress):
    folder = pruned.parent
    opts = finetune_stage.FinetuneOptions(
        checkpoint=pruned,
        data=folder / "train.safetensors",
        eval_data=folder / "dev.safetensors",
        output=folder / "out.safetensors",
        steps=2,
        lr=1e-3,
    )
    ctx, text = _context(progress)
    result = finetune_stage.run(opts, ctx)
    assert result.outputs == [str(folder / "out.safetensors")] and result.exit_code == 0
    assert load(folder / "out.safetensors").headprune.layout.heads == load(pruned).headprune.layout.heads
    assert not (folder / "out.safetensors.state").exists()
    shown = text.getvalue()
    assert "finetune: 2 steps, lr 0.001" in shown and f"wrote {folder / 'out.safetensors'}" in shown
    assert ("2/2" in shown) == progress  # the bar (steps done/total), only when the context wants progress


# --- import and export ------------------------------------------------------------------
def test_import_run_copies_a_checkpoint_and_refuses_a_missing_source(pruned, tmp_path):
    ctx, text = _context()
    result = import_stage.run(import_stage.ImportOptions(source=pruned, output=tmp_path / "copy.safetensors"), ctx)
    assert result.outputs == [str(tmp_path / "copy.safetensors")] and result.value == sha256_file(
        tmp_path / "copy.safetensors"
    )
    assert f"sha256 {result.value[:12]}" in text.getvalue()
    with pytest.raises(CheckpointError, match="no such folder or file"):
        import_stage.run(import_stage.ImportOptions(source=tmp_path / "absent", output=tmp_path / "x.safetensors"), ctx)
    assert not (tmp_path / "x.safetensors").exists()


def test_export_run_writes_a_folder_that_imports_back(pruned, tmp_path):
    ctx, text = _context()
    with pytest.raises(UsageError, match="exactly one of --onnx FILE, --hf DIR, --gguf FILE or --vllm DIR"):
        export_stage.run(export_stage.ExportOptions(checkpoint=pruned), ctx)
    with pytest.raises(UsageError, match="go with --hf DIR"):
        export_stage.run(export_stage.ExportOptions(checkpoint=pruned, onnx=tmp_path / "m.onnx", with_onnx=True), ctx)
    result = export_stage.run(export_stage.ExportOptions(checkpoint=pruned, hf=tmp_path / "folder"), ctx)
    assert result.outputs == [str(tmp_path / "folder")] and (tmp_path / "folder" / "config.json").is_file()
    back = import_stage.run(
        import_stage.ImportOptions(source=tmp_path / "folder", output=tmp_path / "back.safetensors"), ctx
    )
    assert load(tmp_path / "back.safetensors").headprune.layout.heads == load(pruned).headprune.layout.heads
    assert back.exit_code == 0 and f"wrote {tmp_path / 'folder'}/" in text.getvalue()
