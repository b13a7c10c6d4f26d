"""scripts/benchmarks/recovery_llm.py on the tiny LLaMA: the adapters it merges from a saved
training state are the ones `finetune --lora` merges, and a run writes its curve and rate trial."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import headprune_cli as hp
from headprune_cli.stages.options import LoraSpec
from headprune_cli.stages.training.lora import attach, merge
from scripts.benchmarks import recovery_llm
from scripts.benchmarks import recovery_llm_report as report
from tests.support import ROOT
from tests.support.gguf_models import TEXT, tiny_llama


def test_merge_lora_matches_peft():
    adapted = tiny_llama()
    peft_model = attach(adapted, LoraSpec(rank=4, alpha=8.0), seed=0)
    with torch.no_grad():  # peft starts B at zero: give every adapter a visible update
        for p in adapted.parameters():
            if p.requires_grad:
                p.normal_(0, 0.1)
    adapters = {n: p.detach().clone() for n, p in adapted.named_parameters() if p.requires_grad}
    expected = merge(peft_model).state_dict()
    ours = tiny_llama()
    assert recovery_llm.merge_lora(ours, adapters, scaling=2.0) == len(adapters) // 2
    assert any(not torch.equal(v, tiny_llama().state_dict()[k]) for k, v in ours.state_dict().items())
    for name, value in ours.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-6)


def test_merge_lora_refuses_an_adapter_without_its_pair():
    with pytest.raises(KeyError):
        recovery_llm.merge_lora(
            tiny_llama(), {"model.layers.0.self_attn.q_proj" + recovery_llm.LORA_A: torch.zeros(4, 64)}, 2.0
        )
    with pytest.raises(ValueError, match="not a LoRA state"):
        recovery_llm.merge_lora(tiny_llama(), {"model.norm.weight": torch.ones(64)}, 2.0)


def test_curve_and_rate_trial_on_the_tiny_llama(tmp_path):
    model = tmp_path / "tiny.safetensors"
    hp.save(tiny_llama(), model)
    scores = tmp_path / "scores.json"
    cli = [sys.executable, "-m", "headprune_cli"]
    subprocess.run([*cli, "score", model, "--data", TEXT, "--samples", "8", "--ffn", "-o", scores], check=True)
    out = tmp_path / "out"
    argv = ["--model", model, "--scores", scores, "--calib", TEXT, "--train", TEXT, "--heldout", TEXT]
    argv += ["--dev", TEXT, "--out", out, "--unpruned-ppl", 100.0, "--targets", 0.8, "--steps", 20, "--points", 10]
    argv += ["--batch-size", 2, "--max-length", 32, "--eval-rows", 4, "--lora-rank", 2, "--lrs", 1e-3, 1e-2]
    argv += ["--trial-steps", 10, "--label", "tiny"]  # 10 steps between saves: time enough for the copies
    argv += ["--tokens-before", 1000]  # as if the cut had been trained on 1,000 tokens before this run
    done = subprocess.run(
        [sys.executable, "-m", "scripts.benchmarks.recovery_llm", *map(str, argv)], cwd=ROOT, capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["label"] == "tiny" for r in rows)
    trial = [r for r in rows if r["route"] == "lora lr trial"]
    assert sorted(r["lr"] for r in trial) == [1e-3, 1e-2] and all(r["dev_ppl"] > 1 for r in trial)
    best = min(trial, key=lambda r: r["dev_ppl"])["lr"]
    curve = [r for r in rows if r["route"] in ("cut", "lora")]
    assert [r["step"] for r in curve] == [0, 10, 20] and curve[0]["tokens"] == 1000
    assert all(r["lr"] == best for r in curve[1:]) and curve[-1]["peak_rss_gib"] > 0
    assert 1000 < curve[1]["tokens"] <= 1000 + 10 * 2 * 32  # then 10 steps of 2 rows of at most 32 tokens
    # the output finetune merged itself and this script's merge of the adapter it kept agree
    assert curve[-1]["check"] is not None and curve[-1]["check"] < 1e-5
    assert curve[-1]["ppl"] != curve[0]["ppl"]
    losing = f"lora-0.8-lr{1e-2 if best == 1e-3 else 1e-3:g}"
    assert not (out / f"{losing}.safetensors").exists()  # the other rate stopped after the trial
    assert (out / f"{losing}.steps" / "step-00000010").is_dir()
    again = subprocess.run(
        [sys.executable, "-m", "scripts.benchmarks.recovery_llm", *map(str, argv)], cwd=ROOT, capture_output=True
    )
    assert again.returncode == 0 and (out / "results.jsonl").read_text().count("\n") == len(rows)


def test_projection_follows_a_power_law_and_the_table_says_it_is_one():
    rows = [{"target": 0.8, "route": "cut", "step": 0, "tokens": 0, "ppl": 60.0, "x_ppl": 1.6}]
    for step, tokens in ((24, 25_000), (48, 50_000), (96, 100_000)):
        x = 1 + 2 * tokens**-0.25
        rows.append({"target": 0.8, "route": "lora", "step": step, "tokens": tokens, "ppl": 37.29 * x, "x_ppl": x})
    curve = report.curves(rows)[(0.8, "", "lora")]
    assert [r["step"] for r in curve] == [0, 24, 48, 96]
    assert report.projection(curve, 2e6) == pytest.approx(1 + 2 * 2e6**-0.25, rel=1e-9)
    assert report.projection(curve[:2], 2e6) is None  # one trained point fits no slope
    table = report.render(rows, 2e6)
    assert "| 0.8 | LoRA KD | 96 | 100,000 | 41.48 | 1.112 |" in table and "| extrapolated | 2,000,000 | | ~" in table


def test_a_labelled_cut_of_the_same_target_is_its_own_curve():
    rows = [
        {"target": 0.5, "route": "cut", "step": 0, "tokens": 0, "ppl": 99.5, "x_ppl": 2.67},
        {"target": 0.5, "route": "lora", "step": 48, "tokens": 47_185, "ppl": 77.8, "x_ppl": 2.09},
        {"target": 0.5, "route": "cut", "step": 0, "tokens": 0, "ppl": 88.9, "x_ppl": 2.38, "label": "iterate"},
        {"target": 0.5, "route": "lora", "step": 48, "tokens": 47_185, "ppl": 69.9, "x_ppl": 1.87, "label": "iterate"},
    ]
    found = report.curves(rows)
    assert [r["ppl"] for r in found[(0.5, "", "lora")]] == [99.5, 77.8]
    assert [r["ppl"] for r in found[(0.5, "iterate", "lora")]] == [88.9, 69.9]
    table = report.render(rows, 2e6)
    assert "| 0.5 (iterate) | LoRA KD | 48 | 47,185 | 69.90 | 1.870 |" in table
    assert "| 0.5 | LoRA KD | 48 | 47,185 | 77.80 | 2.090 |" in table
