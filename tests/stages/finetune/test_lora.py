"""`finetune --lora`: adapters on the kept projections, merged into an ordinary checkpoint; resume; recompute."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from headprune_cli import load, save
from headprune_cli.errors import UsageError
from headprune_cli.files.outputs import MARKER, MARKER_TEXT, is_claimed, own_claims
from headprune_cli.model.surgery import apply_plan
from headprune_cli.stages.options import LoraSpec
from headprune_cli.stages.training.lora import (
    attach,
    check,
    check_adapter_folder,
    merge,
    projections,
    resolve_targets,
)
from headprune_cli.stages.training.train import FinetuneConfig, finetune
from tests.support import TINY
from tests.support.training import tensor_set


def _pruned(name: str) -> torch.nn.Module:
    """A tiny model with a cut: one whole GQA group (or two heads) and FFN neurons removed."""
    model = TINY[name]()
    apply_plan(model, {0: [0, 1, 2, 3]} if name == "llama-gqa" else {0: [1], 2: [0]}, [])
    return model


def _causal_data(rows: int = 16) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(2, 60, (rows, 8), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _logits(model, data) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits


def test_default_targets_are_every_attention_and_ffn_projection():
    names = projections(TINY["llama-gqa"]())
    leaves = {n.rsplit(".", 1)[1] for n in names}
    assert leaves == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert len(names) == 3 * 7  # three layers
    bert = {n.split("layer.0.", 1)[1] for n in projections(TINY["bert"]()) if ".layer.0." in n}
    assert bert == {
        "attention.self.query",
        "attention.self.key",
        "attention.self.value",
        "attention.output.dense",
        "intermediate.dense",
        "output.dense",
    }
    assert not any("pooler" in n or "classifier" in n for n in projections(TINY["bert"]()))
    assert set(resolve_targets(TINY["llama-gqa"](), ("q_proj", "v_proj"))) == {
        f"model.layers.{i}.self_attn.{p}" for i in range(3) for p in ("q_proj", "v_proj")
    }


@pytest.mark.parametrize("name", ["llama-gqa", "bert", "gpt2"])
def test_merged_model_equals_the_adapter_applied_model(name):
    model, data = _pruned(name), _causal_data()
    keys = {k: v.shape for k, v in model.state_dict().items()}
    adapted = attach(model, LoraSpec(rank=2, alpha=4.0), seed=0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():  # B starts at zero (the adapter is a no-op): give it a real update
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))))
    applied = _logits(model, data)
    base = _logits(_pruned(name), data)
    assert (applied - base).abs().max() > 0.01 * base.abs().max()  # the adapters change the outputs
    merged = merge(adapted)
    assert merged is model and {k: v.shape for k, v in merged.state_dict().items()} == keys
    torch.testing.assert_close(_logits(merged, data), applied, rtol=1e-4, atol=1e-6)


def test_cli_output_is_an_ordinary_checkpoint_and_the_kept_adapter_reproduces_it(cli, tmp_path):
    from peft import PeftModel

    save(TINY["llama-gqa"](), tmp_path / "root.safetensors")
    model = load(tmp_path / "root.safetensors")
    apply_plan(model, {0: [0, 1, 2, 3]}, [])
    save(model, tmp_path / "pruned.safetensors")
    train = tensor_set(tmp_path / "train.safetensors", labels=False)
    args = ["finetune", tmp_path / "pruned.safetensors", "--data", train, "--teacher", "auto", "--steps", "3"]
    res = cli(
        *args,
        "--lr",
        "1e-2",
        "--lora",
        "--lora-rank",
        "4",
        "--keep-adapter",
        tmp_path / "ad",
        "-o",
        tmp_path / "o.safetensors",
    )
    assert res.code == 0, res.err
    out, src = load_file(str(tmp_path / "o.safetensors")), load_file(str(tmp_path / "pruned.safetensors"))
    assert {k: v.shape for k, v in out.items()} == {k: v.shape for k, v in src.items()}  # no lora tensors
    assert any(not torch.equal(out[k], src[k]) for k in out)  # trained
    assert sorted(p.name for p in (tmp_path / "ad").iterdir() if not p.name.startswith(".")) == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert not list(tmp_path.glob(".*tmp"))  # no temporaries left behind
    served = PeftModel.from_pretrained(load(tmp_path / "pruned.safetensors"), str(tmp_path / "ad"))
    data = _causal_data()
    torch.testing.assert_close(
        _logits(served, data), _logits(load(tmp_path / "o.safetensors"), data), rtol=1e-5, atol=1e-5
    )


def _lm_loss(model) -> dict[str, float]:
    data = _causal_data(8)
    with torch.no_grad():
        logits = model(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), data["input_ids"][:, 1:].flatten())
    return {"perplexity": math.exp(float(loss))}


def _lora_run(tmp_path: Path, **extra):
    model = _pruned("llama-gqa")
    attach(model, LoraSpec(rank=2, dropout=0.1), seed=0)  # dropout on: the RNG must resume too
    cfg = {"steps": 6, "lr": 1e-2, "batch_size": 8, "warmup": 0, "state_dir": tmp_path / "st", "save_every": 2}
    # Evaluated every epoch (2 steps), so the best-so-far adapters are kept, saved and restored too.
    return finetune(model, _causal_data(), FinetuneConfig(**cfg, **extra), _lm_loss, fingerprint={"lora": 2})


def test_lora_resume_mid_run_equals_an_uninterrupted_run(tmp_path):
    straight = _lora_run(tmp_path / "a")
    stopped = _lora_run(tmp_path / "b", stop_after=3)
    assert not stopped.completed
    # The state holds the adapters only: the frozen weights are the input checkpoint's.
    saved = load_file(str(next((tmp_path / "b" / "st").glob("step-*")) / "model.safetensors"))
    assert saved and all("lora_" in name for name in saved)
    resumed = _lora_run(tmp_path / "b", resume=True)
    assert resumed.completed and resumed.steps == 6
    assert resumed.best_epoch == straight.best_epoch is not None
    for name, value in straight.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], value, rtol=0, atol=0)


@pytest.mark.parametrize("lora", [False, True])
def test_recompute_changes_no_gradient(lora):
    """Same weights after a few steps with and without recompute, with head dropout's gates on
    (they must stay attached through the backward, when the blocks run again)."""
    from headprune_cli.stages.training.gating import HeadDropout

    def build():
        model = _pruned("llama-gqa")
        if lora:
            attach(model, LoraSpec(rank=2), seed=0)
        return model

    fresh = {k: v.clone() for k, v in build().state_dict().items()}
    results = []
    for recompute in (False, True):
        model = build()
        cfg = FinetuneConfig(steps=3, lr=1e-2, batch_size=8, warmup=0, recompute=recompute)
        result = finetune(model, _causal_data(), cfg, gating=HeadDropout(model, 0.3, seed=1))
        results.append({k: v.detach().clone() for k, v in result.model.state_dict().items()})
    assert any(not torch.equal(results[0][k], fresh[k]) for k in fresh)  # it trained
    for name, value in results[0].items():
        torch.testing.assert_close(results[1][name], value, rtol=1e-6, atol=1e-7)


def test_lora_defaults_to_ten_times_full_trainings_rate_and_an_explicit_lr_wins(tmp_path):
    from headprune_cli.stages.finetune.stage import FinetuneOptions
    from headprune_cli.stages.training.run import chosen_lr
    from headprune_cli.stages.training.train import default_lr

    model = _pruned("llama-gqa")
    common = {"checkpoint": tmp_path / "m.safetensors", "data": tmp_path / "d.jsonl", "output": tmp_path / "o"}
    assert chosen_lr(FinetuneOptions(**common, lora=True), model) == pytest.approx(10 * default_lr(model))
    assert chosen_lr(FinetuneOptions(**common, lora=True, lr=3e-4), model) == 3e-4
    assert chosen_lr(FinetuneOptions(**common), model) is None  # full training: train.py's default_lr


@pytest.mark.parametrize(("rank", "alpha", "scale"), [(2, 6.0, 3.0), (4, 1.0, 0.25), (3, None, 2.0)])
def test_merged_update_is_b_times_a_scaled_by_alpha_over_rank(rank, alpha, scale):
    """The merged weight is W + (alpha / r) B A, computed here by hand: an explicit --lora-alpha,
    or 2 r when absent (scale 2). Independent of peft's own bookkeeping."""
    model = TINY["llama-gqa"]()
    name = "model.layers.1.self_attn.q_proj"
    before = dict(model.named_modules())[name].weight.detach().clone()
    adapted = attach(model, LoraSpec(rank=rank, alpha=alpha), seed=0)
    wrapped = dict(model.named_modules())[name]
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        a = torch.randn(wrapped.lora_A["default"].weight.shape, generator=gen)
        b = torch.randn(wrapped.lora_B["default"].weight.shape, generator=gen)
        wrapped.lora_A["default"].weight.copy_(a)
        wrapped.lora_B["default"].weight.copy_(b)
    assert a.shape == (rank, before.shape[1]) and b.shape == (before.shape[0], rank)
    merged = dict(merge(adapted).named_modules())[name].weight.detach()
    torch.testing.assert_close(merged, before + scale * (b @ a), rtol=1e-5, atol=1e-5)


def test_cli_lora_alpha_reaches_the_kept_adapter(cli, tmp_path):
    import json

    save(TINY["llama-gqa"](), tmp_path / "m.safetensors")
    train = tensor_set(tmp_path / "train.safetensors", labels=False)
    common = ["finetune", tmp_path / "m.safetensors", "--data", train, "--steps", "1", "--lora", "--lora-rank", "4"]
    for extra, expected in (([], 8.0), (["--lora-alpha", "3"], 3.0)):
        folder = tmp_path / f"ad{len(extra)}"
        res = cli(*common, *extra, "--keep-adapter", folder, "-o", tmp_path / f"o{len(extra)}.safetensors")
        assert res.code == 0, res.err
        config = json.loads((folder / "adapter_config.json").read_text())
        assert (config["r"], config["lora_alpha"]) == (4, expected)


def test_check_bounds_dropout_alpha_and_rank_at_their_edges():
    """[0, 1) for dropout, alpha > 0, 1 <= rank <= the narrowest targeted projection's width
    (its k_proj, 8 wide, on the tiny GQA LLaMA): each edge accepted, one step past it refused."""
    model = TINY["llama-gqa"]()
    for ok in (LoraSpec(dropout=0.0), LoraSpec(dropout=0.99), LoraSpec(alpha=0.5), LoraSpec(rank=1), LoraSpec(rank=8)):
        assert check(model, ok)
    narrowest = "(the narrowest targeted projection, model.layers.0.self_attn"
    bad = [
        (LoraSpec(dropout=1.0), "--lora-dropout 1.0 is outside [0, 1)"),
        (LoraSpec(dropout=-0.1), "--lora-dropout -0.1 is outside [0, 1)"),
        (LoraSpec(alpha=0.0), "--lora-alpha must be positive (got 0.0)"),
        (LoraSpec(alpha=-2.0), "--lora-alpha must be positive (got -2.0)"),
        (LoraSpec(rank=9), f"--lora-rank 9 is outside 1..8 {narrowest}.k_proj, is 8 wide)"),
        (LoraSpec(rank=0), "--lora-rank 0 is outside 1..8"),
        (LoraSpec(rank=33, targets=("q_proj",)), f"--lora-rank 33 is outside 1..32 {narrowest}.q_proj, is 32 wide)"),
    ]
    for spec, message in bad:
        with pytest.raises(UsageError, match=re.escape(message)):
            check(model, spec)


def test_unmatched_targets_are_named_with_the_projections_a_block_has():
    with pytest.raises(UsageError) as refused:
        resolve_targets(TINY["llama-gqa"](), ("q_proj", "nope", "mlp.up_proj", "also_not"))
    assert str(refused.value).startswith("--lora-targets nope,also_not matches none")
    listed = str(refused.value).split("(available: ", 1)[1].rstrip(")").split(", ")
    # Each block's seven projections, once each, in the model's order (not 21 full names).
    assert listed == [
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ]


def test_a_resumed_run_must_share_every_lora_setting():
    """The fingerprint changes with each setting that changes training, and not with how the same
    scale was written (no --lora-alpha is 2 x rank)."""
    base = LoraSpec(rank=4, alpha=None, dropout=0.1, targets=("q_proj",))
    assert base.fingerprint() == LoraSpec(rank=4, alpha=8.0, dropout=0.1, targets=("q_proj",)).fingerprint()
    for changed in (
        LoraSpec(rank=2, alpha=8.0, dropout=0.1, targets=("q_proj",)),
        LoraSpec(rank=4, alpha=4.0, dropout=0.1, targets=("q_proj",)),
        LoraSpec(rank=4, alpha=None, dropout=0.0, targets=("q_proj",)),
        LoraSpec(rank=4, alpha=None, dropout=0.1, targets=None),
    ):
        assert changed.fingerprint() != base.fingerprint(), changed


def test_the_merged_model_trains_every_parameter_again():
    """peft froze the dense weights; the merged model is an ordinary one, as a later stage trains it."""
    model = _pruned("llama-gqa")
    adapted = attach(model, LoraSpec(rank=2), seed=0)
    assert not all(p.requires_grad for p in model.parameters())
    merged = merge(adapted)
    assert list(merged.parameters()) and all(p.requires_grad for p in merged.parameters())


def test_keep_adapter_folder_refusals_name_the_option(tmp_path):
    source = tmp_path / "in.safetensors"
    source.write_bytes(b"x")
    with own_claims():
        new = tmp_path / "new"
        assert check_adapter_folder(new, False, [source]) == new and is_claimed(new)  # claimed until written
        assert check_adapter_folder(tmp_path / "forced", True, [source]) == tmp_path / "forced"
        assert not is_claimed(tmp_path / "forced")  # --force replaces whatever is there at the end
        ours = tmp_path / "ours"
        ours.mkdir()
        (ours / MARKER).write_text(MARKER_TEXT)
        assert check_adapter_folder(ours, True, [source]) == ours
        with pytest.raises(UsageError, match=re.escape(f"{ours} exists; pass --force to overwrite it")):
            check_adapter_folder(ours, False, [source])
        mine = tmp_path / "mine"
        mine.mkdir()
        (mine / "notes.txt").write_text("mine\n")
        with pytest.raises(UsageError, match=re.escape(f"--keep-adapter folder {mine} holds files headprune")):
            check_adapter_folder(mine, True, [source])
        with pytest.raises(UsageError, match="is also an input"):
            check_adapter_folder(source, True, [source])


def test_without_peft_attach_is_a_one_line_refusal_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # what `import peft` meets where it is not installed
    with pytest.raises(UsageError, match="^" + re.escape("--lora needs peft: pip install 'headprune[lora]'")):
        attach(TINY["llama-gqa"](), LoraSpec(rank=2), seed=0)


@pytest.mark.parametrize("targets", [None, ("q_proj", "mlp.down_proj")])
def test_attach_wraps_exactly_the_targeted_projections_with_the_specs_dropout(targets):
    model = TINY["llama-gqa"]()
    wanted = set(resolve_targets(model, targets))
    attach(model, LoraSpec(rank=2, dropout=0.25, targets=targets), seed=0)
    wrapped = {n.removeprefix("base_model.model."): m for n, m in model.named_modules() if hasattr(m, "lora_A")}
    assert set(wrapped) == wanted and len(wanted) == (21 if targets is None else 6)
    for module in wrapped.values():
        dropout = module.lora_dropout["default"]
        assert isinstance(dropout, torch.nn.Dropout) and dropout.p == 0.25


def test_a_projection_cut_to_one_neuron_is_still_adapted():
    model = TINY["llama-gqa"]()
    apply_plan(model, {}, [], {1: list(range(47))})  # layer 1 keeps 1 of its 48 FFN neurons
    chosen = resolve_targets(model, ("mlp.up_proj", "mlp.down_proj"))
    assert sorted(chosen) == [f"model.layers.{i}.mlp.{p}" for i in range(3) for p in ("down_proj", "up_proj")]
    assert chosen["model.layers.1.mlp.up_proj"].weight.shape == (1, 32)
    assert check(model, LoraSpec(rank=1, targets=("mlp.up_proj",)))  # width 1 bounds the rank at 1
    with pytest.raises(UsageError, match=re.escape("--lora-rank 2 is outside 1..1")):
        check(model, LoraSpec(rank=2, targets=("mlp.up_proj",)))


def test_attaching_adapters_prints_no_warning_about_peft_internals():
    """peft reads transformers' deprecated `is_gradient_checkpointing`; every --lora run printed
    that FutureWarning, which names nothing the user can change."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attach(TINY["llama-gqa"](), LoraSpec(rank=2), seed=0)
    assert [str(w.message) for w in caught if "checkpointing" in str(w.message)] == []
