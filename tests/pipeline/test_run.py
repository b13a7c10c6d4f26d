"""`headprune run`: config validation (every problem at once) and rerun/skip logic.

Skip logic is tested with stub stages (the real stages' options, a stand-in `run`), so
these tests are fast and independent of what the real stages compute; tests/pipeline/test_demo.py
runs the real stages on the bundled example.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import yaml

import headprune_cli
from headprune_cli.pipeline.config import ConfigError
from headprune_cli.pipeline.execute import STATE_FILE, execute, exit_code
from headprune_cli.pipeline.prepare import prepare
from headprune_cli.stages import unit
from tests.support import ROOT, TINY

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


# --- stub stages: the real stages' options, each writes a file naming its inputs ------
calls: list[str] = []


def _write(out: Path, *parts) -> None:
    digest = hashlib.sha256()
    for part in parts:
        p = Path(str(part))
        digest.update(p.read_bytes() if p.is_file() else str(part).encode())
    out.write_text(digest.hexdigest())


def _stub_outputs(command: str, o) -> None:
    if command == "score":
        _write(o.output, o.checkpoint, o.data, o.method, o.seed)
    elif command == "select":
        _write(o.output, o.scores, o.ratio, o.min_heads)
    elif command == "prune":
        _write(o.output, o.checkpoint, o.plan, o.scores, o.ratio)
    elif command == "finetune":
        _write(o.output, o.checkpoint, o.data, o.steps, o.seed)
    elif command == "report":
        _write(Path(o.json_out), o.model, o.baseline, o.data, o.max_drop)
        o.markdown_out.write_text("# report\n")


def stub_main(stage) -> int:
    """Runs in place of a stage: the options the pipeline built, as the real stage gets them."""
    calls.append(stage.command)
    options = unit.get(stage.command).options.model_validate(stage.params)
    _stub_outputs(stage.command, options)
    return 3 if stage.command == "report" and options.max_drop is not None and options.max_drop < 0.5 else 0


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A folder with a tiny checkpoint and data files; paths in configs are relative to it."""
    monkeypatch.chdir(tmp_path)
    model = TINY["reference"]()
    headprune_cli.save(model, tmp_path / "model.safetensors")
    for name in ("calib.jsonl", "train.jsonl", "dev.jsonl"):
        (tmp_path / name).write_text('{"text": "a b", "label": 0}\n')
    calls.clear()
    return tmp_path


def config(**changes) -> dict:
    base = {
        "model": "model.safetensors",
        "data": "calib.jsonl",
        "train_data": "train.jsonl",
        "eval_data": "dev.jsonl",
        "out": "out",
        "seed": 0,
        "stages": [
            {"command": "score", "method": "taylor"},
            {"command": "select", "ratio": 0.25},
            {"command": "prune"},
            {"command": "finetune", "steps": 5},
            {"command": "report", "max_drop": 1.0},
        ],
    }
    return {**base, **changes}


def run_stub(cfg: dict, overrides=(), force=False):
    pipeline = prepare(cfg, list(overrides))
    calls.clear()
    return execute(pipeline, stub_main, force=force)


# --- validation --------------------------------------------------------------------------
def test_every_problem_reported_together_before_any_work(workdir):
    cfg = config(model="missing.safetensors", sede=1)
    cfg["stages"] = [
        {"command": "score", "methd": "taylor"},  # typo in a key
        {"command": "finetune", "steps": "many"},  # wrong type
        {"command": "prune"},  # needs a plan or scores: no earlier stage makes one
        {"command": "reprot"},  # unknown command
    ]
    with pytest.raises(ConfigError) as info:
        prepare(cfg)
    problems = info.value.problems
    text = "\n".join(problems)
    assert "sede: unknown key (did you mean 'seed'?" in text
    assert "stages.0 (score).methd: unknown key (did you mean 'method'?" in text
    assert "stages.1 (finetune).steps: Input should be a valid integer" in text
    assert "model: missing.safetensors: no such checkpoint file" in text
    assert "stages.2 (prune): needs `plan`" in text
    assert "stages.3.command: unknown command 'reprot' (did you mean 'report'?" in text
    assert len(problems) == 6, problems
    assert not (workdir / "out").exists()


def test_a_command_that_is_not_a_name_is_an_unknown_command(workdir):
    cfg = config(stages=[{"command": ["score"]}, {"command": 3}])  # a YAML list or number, not a name
    with pytest.raises(ConfigError) as info:
        prepare(cfg)
    text = "\n".join(info.value.problems)
    assert "stages.0.command: unknown command ['score']" in text
    assert "stages.1.command: unknown command 3" in text


def test_select_without_scores_and_bounds_and_pipeline_owned_options(workdir):
    cfg = config(stages=[{"command": "select", "ratio": 0.3, "min_heads": -1, "output": "x.json"}])
    with pytest.raises(ConfigError) as info:
        prepare(cfg)
    text = "\n".join(info.value.problems)
    assert "stages.0 (select): needs `scores`, which no earlier stage makes" in text
    assert "stages.0 (select).min_heads: Input should be greater than or equal to 1" in text
    assert "stages.0 (select).output: set by the pipeline" in text


def test_cli_prints_one_line_per_problem_and_exits_2(workdir, cli):
    cfg = config(data="nowhere.jsonl")
    cfg["stages"][0]["methd"] = "loo"
    cfg["stages"][3]["steps"] = 1.5
    (workdir / "bad.yaml").write_text(yaml.safe_dump(cfg))
    result = cli("run", "bad.yaml")
    assert result.code == 2
    lines = result.err.strip().splitlines()
    assert all(line.startswith("Error: ") for line in lines)
    assert len(lines) == 3, lines
    assert not (workdir / "out").exists()


def test_set_overrides_by_stage_name_and_index(workdir):
    pipeline = prepare(config(), ["stages.select.ratio=0.5", "stages.3.steps=7", "seed=3"])
    argv = {s.name: s.argv for s in pipeline.stages}
    assert argv["select"][argv["select"].index("--ratio") + 1] == "0.5"
    assert argv["finetune"][argv["finetune"].index("--steps") + 1] == "7"
    assert argv["score"][argv["score"].index("--seed") + 1] == "3"
    with pytest.raises(ConfigError, match="no stage 'sellect'"):
        prepare(config(), ["stages.sellect.ratio=0.5"])


def test_implicit_wiring(workdir):
    pipeline = prepare(config())
    argv = {s.name: " ".join(s.argv) for s in pipeline.stages}
    assert argv["score"].startswith("score model.safetensors") and "--data calib.jsonl" in argv["score"]
    assert argv["select"].startswith("select out/scores.json")
    assert "--plan out/plan.json" in argv["prune"] and argv["prune"].startswith("prune model.safetensors")
    assert argv["finetune"].startswith("finetune out/pruned.safetensors") and "--data train.jsonl" in argv["finetune"]
    assert "--model out/finetuned.safetensors" in argv["report"] and "--baseline model.safetensors" in argv["report"]
    assert "--data dev.jsonl" in argv["report"] and "--json out/report.json" in argv["report"]
    # prune with a ratio and no select stage reads the scores
    pipeline = prepare(config(stages=[{"command": "score"}, {"command": "prune", "ratio": 0.5}]))
    assert "--scores out/scores.json" in " ".join(pipeline.stages[1].argv)


def test_the_seed_reaches_prune_only_when_it_selects(workdir):
    applies = {s.name: s.argv for s in prepare(config(seed=3)).stages}
    assert "--seed" not in applies["prune"]  # a plan: --seed is a selection option, refused beside it
    selects = prepare(config(seed=3, stages=[{"command": "score"}, {"command": "prune", "ratio": 0.5}])).stages[1]
    assert selects.argv[selects.argv.index("--seed") + 1] == "3"


def test_env_vars_in_paths(workdir, monkeypatch):
    monkeypatch.setenv("HP_TEST_DIR", str(workdir))
    pipeline = prepare(config(model="${HP_TEST_DIR}/model.safetensors"))
    assert pipeline.config.model == f"{workdir}/model.safetensors"
    monkeypatch.delenv("HP_TEST_DIR")
    with pytest.raises(ConfigError, match="environment variable HP_TEST_DIR is not set"):
        prepare(config(model="${HP_TEST_DIR}/model.safetensors"))


def test_out_folder_with_foreign_files_is_refused(workdir):
    """Even `run --force` never writes into a folder headprune did not make: it may hold a user's files."""
    (workdir / "out").mkdir()
    (workdir / "out" / "precious.txt").write_text("keep")
    with pytest.raises(ConfigError, match="holds files headprune did not write"):
        prepare(config())
    (workdir / "out" / "precious.txt").unlink()
    run_stub(config())  # an empty folder is adopted and marked
    assert (workdir / "out" / ".headprune").is_file()
    prepare(config())


# --- reruns --------------------------------------------------------------------------------
def test_rerun_skips_unchanged_and_redoes_from_the_changed_stage(workdir):
    first = run_stub(config())
    assert [r.status for r in first] == ["ran"] * 5 and calls == ["score", "select", "prune", "finetune", "report"]
    files = {p: p.read_bytes() for p in (workdir / "out").iterdir()}

    again = run_stub(config())
    assert [r.status for r in again] == ["skipped"] * 5 and calls == []

    changed = run_stub(config(), ["stages.select.ratio=0.5"])
    assert [r.status for r in changed] == ["skipped", "ran", "ran", "ran", "ran"]
    assert calls == ["select", "prune", "finetune", "report"]

    # an input file changing on disk is noticed by its sha256
    (workdir / "train.jsonl").write_text('{"text": "b a", "label": 1}\n')
    redo = run_stub(config(), ["stages.select.ratio=0.5"])
    assert calls == ["finetune", "report"]
    # a deleted artifact is remade
    (workdir / "out" / "report.md").unlink()
    run_stub(config(), ["stages.select.ratio=0.5"])
    assert calls == ["report"]
    assert [r.status for r in redo][:3] == ["skipped"] * 3
    assert set(files) <= {p for p in (workdir / "out").iterdir()}


def test_force_redoes_everything_and_gate_failure_exits_3(workdir):
    run_stub(config())
    results = run_stub(config(), ["stages.report.max_drop=0.1"], force=True)
    assert calls == ["score", "select", "prune", "finetune", "report"]
    assert exit_code(results) == 3
    # the gate failure is remembered: a skipped failing report still exits 3
    assert exit_code(run_stub(config(), ["stages.report.max_drop=0.1"])) == 3 and calls == []


def test_failed_stage_stops_the_run_and_is_redone_next_time(workdir):
    cfg = config()
    cfg["stages"][3]["data"] = "dev.jsonl"
    pipeline = prepare(cfg)

    def failing(stage):
        return 1 if stage.command == "finetune" else stub_main(stage)

    results = execute(pipeline, failing)
    assert [r.status for r in results] == ["ran", "ran", "ran", "failed"] and exit_code(results) == 1
    assert "finetune" not in (workdir / "out" / STATE_FILE).read_text()
    run_stub(cfg)
    assert calls == ["finetune", "report"]


def test_resolved_config_written(workdir):
    run_stub(config())
    resolved = yaml.safe_load((workdir / "out" / "resolved.yaml").read_text())
    assert resolved["model"] == "model.safetensors"
    assert resolved["stages"][1]["ratio"] == 0.25
    assert resolved["stages"][1]["argv"][:3] == ["headprune", "select", "out/scores.json"]


# --- shipped configs -----------------------------------------------------------------------
def test_every_shipped_config_validates_and_says_how_to_run_it(monkeypatch, tmp_path, minilm_dir):

    assert {p.name for p in CONFIGS} >= {"demo.yaml", "minilm.yaml", "causal-lm.yaml", "ci-gate.yaml"}
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("MINILM_DIR", str(minilm_dir))
    causal = tmp_path / "causal-lm.safetensors"
    _make_causal_lm(causal)
    for path in CONFIGS:
        first = path.read_text().splitlines()[0]
        assert first.startswith("#") and f"headprune run configs/{path.name}" in first, (path.name, first)
        overrides = [f"model={causal}"] if path.name == "causal-lm.yaml" else []
        pipeline = prepare(path, overrides, out=str(tmp_path / path.stem))
        assert pipeline.stages, path.name


def _make_causal_lm(path: Path) -> None:
    import subprocess
    import sys

    script = ROOT / "scripts" / "tools" / "make_causal_lm.py"
    subprocess.run(
        [sys.executable, str(script), "--out", str(path), "--steps", "0"],
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_prune_reads_data_only_to_compensate(workdir):
    # Given the pipeline's data, prune compensates by default, as `prune --data` does on the command line.
    cfg = config(stages=[{"command": "score"}, {"command": "select", "ratio": 0.5}, {"command": "prune"}])
    argv = prepare(cfg).stages[2].argv
    assert argv[argv.index("--data") + 1] == "calib.jsonl" and "--compensate" not in argv
    cfg["stages"][2]["compensate"] = "none"
    assert "--data" not in prepare(cfg).stages[2].argv
    cfg["stages"][2]["compensate"] = "lstsq"
    argv = prepare(cfg).stages[2].argv
    assert argv[argv.index("--data") + 1] == "calib.jsonl"
    with pytest.raises(ConfigError, match=r"stages.2 \(prune\): needs `data`"):
        prepare({k: v for k, v in cfg.items() if k not in ("data",)})
    # Without data and without `compensate`, prune cuts without compensation.
    del cfg["stages"][2]["compensate"]
    cfg["stages"][0]["data"] = cfg.pop("data")  # only the score stage has data
    assert "--data" not in prepare(cfg).stages[2].argv


def test_check_prints_the_commands_and_runs_nothing(cli, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    result = cli("run", "configs/demo.yaml", "--check", "--out", str(tmp_path / "o"))
    assert result.code == 0
    lines = result.out.strip().splitlines()
    assert [line.split()[1] for line in lines] == ["score", "select", "prune", "finetune", "report"]
    assert lines[1].startswith(f"headprune select {tmp_path}/o/scores.json --ratio 0.5")
    assert not (tmp_path / "o").exists()


def test_an_iterate_stage_takes_ffn_and_a_flops_schedule(workdir):
    cfg = config(stages=[{"command": "iterate", "method": "fisher", "ffn": True, "target_flops": "0.9,0.7"}])
    argv = prepare(cfg).stages[0].argv
    assert argv[0] == "iterate" and "--ffn" in argv and argv[argv.index("--target-flops") + 1] == "0.9,0.7"
    assert argv[argv.index("--data") + 1] == "train.jsonl" and argv[argv.index("--eval-data") + 1] == "dev.jsonl"
    cfg["stages"][0]["target_flops"] = "0.7,0.9"  # rising: refused before any stage runs
    with pytest.raises(ConfigError, match=r"stages.0 \(iterate\).target_flops: the flops fractions to keep must fall"):
        prepare(cfg)


def test_a_block_params_budget_reaches_prune_select_and_iterate_stages(workdir):
    # prune with target_block_params and no select stage reads the scores, as with a ratio
    pipeline = prepare(config(stages=[{"command": "score"}, {"command": "prune", "target_block_params": 0.8}]))
    argv = " ".join(pipeline.stages[1].argv)
    assert "--scores out/scores.json" in argv and "--target-block-params 0.8" in argv
    stages = [{"command": "score"}, {"command": "select", "target_block_params": 0.8}, {"command": "prune"}]
    assert "--target-block-params 0.8" in " ".join(prepare(config(stages=stages)).stages[1].argv)
    cfg = config(stages=[{"command": "iterate", "ffn": True, "target_block_params": "0.9,0.7"}])
    argv = prepare(cfg).stages[0].argv
    assert argv[argv.index("--target-block-params") + 1] == "0.9,0.7"
    cfg["stages"][0]["target_block_params"] = "0.7,0.9"  # rising: refused before any stage runs
    with pytest.raises(ConfigError, match=r"target_block_params: the block params fractions to keep must fall"):
        prepare(cfg)
    cfg = config(stages=[{"command": "score"}, {"command": "select", "target_block_params": 1.5}])
    with pytest.raises(ConfigError, match=r"--target-block-params 1.5 is outside \(0, 1\]"):
        prepare(cfg)
