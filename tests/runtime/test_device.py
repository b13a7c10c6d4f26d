"""--device / --dtype: resolution, bad values, float64 score sums of a bf16 model, dtype kept on disk."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers as T
from safetensors import safe_open

from headprune_cli import save
from headprune_cli.errors import UsageError
from headprune_cli.pipeline.prepare import prepare
from headprune_cli.runtime.device import (
    check_map,
    device_map_for,
    model_bytes,
    place,
    resolve_device,
    resolve_dtype,
    restore,
)
from tests.support import TINY, give_tokenizer, write_text

CUDA = torch.device("cuda", 0) if torch.cuda.is_available() else None


def test_resolution():
    assert resolve_device("auto") == (CUDA or torch.device("cpu"))
    assert resolve_device(" CPU ") == torch.device("cpu")
    assert resolve_dtype("auto") is None
    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype("float32") is torch.float32
    for bad in ("tpu", "cuda:x", "cuda:-1"):
        with pytest.raises(UsageError, match="expected auto, cpu, cuda or cuda:N"):
            resolve_device(bad)
    with pytest.raises(UsageError, match="--dtype int8"):
        resolve_dtype("int8")
    with pytest.raises(UsageError, match="--device cuda:7"):  # no machine here has 8 GPUs
        resolve_device("cuda:7")


@pytest.fixture
def files(tmp_path):
    """A tiny LLaMA saved in float32 and in bfloat16 (same weights, rounded), and text data."""
    model = give_tokenizer(TINY["llama"](), encoder=False)
    save(model, tmp_path / "f32.safetensors")
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)
    save(model, tmp_path / "bf16.safetensors")
    write_text(tmp_path / "d.txt", 24)
    return tmp_path


def _dtypes(path) -> set[str]:
    with safe_open(str(path), "pt") as f:
        # safe_open has keys() but no __iter__
        return {str(f.get_slice(k).get_dtype()) for k in f.keys() if "inv_freq" not in k}  # noqa: SIM118


@pytest.mark.parametrize(
    "command",
    [
        ["score", "{f}/f32.safetensors", "--data", "{f}/d.txt", "-o", "{f}/out.json"],
        [
            "prune",
            "{f}/f32.safetensors",
            "--plan",
            "{f}/d.txt",
            "--compensate",
            "lstsq",
            "--data",
            "{f}/d.txt",
            "-o",
            "{f}/out.json",
        ],
        ["finetune", "{f}/f32.safetensors", "--data", "{f}/d.txt", "-o", "{f}/out.json"],
        ["report", "--model", "{f}/f32.safetensors", "--data", "{f}/d.txt", "--json", "{f}/out.json"],
        ["sweep", "{f}/f32.safetensors", "--data", "{f}/d.txt", "--eval-data", "{f}/d.txt", "-o", "{f}/out.json"],
    ],
    ids=lambda c: c[0],
)
@pytest.mark.parametrize("flag", [["--device", "cuda:7"], ["--dtype", "int8"]], ids=["device", "dtype"])
def test_bad_device_or_dtype_is_one_error_line(files, cli, command, flag):
    args = [a.format(f=files) for a in command] + flag
    result = cli(*args)
    assert result.code == 2, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {flag[0]} {flag[1]}"), result.err
    assert result.out == "" and not (files / "out.json").exists()


def _scores(cli, files, *args) -> tuple[list[float], dict]:
    result = cli("score", *args, "--data", files / "d.txt", "--method", "taylor", "--samples", "16")
    assert result.code == 0, result.err
    artifact = json.loads(result.out)
    return [v for layer in sorted(artifact["heads"]) for _, v in sorted(artifact["heads"][layer].items())], artifact


def test_bf16_scores_are_finite_and_close_to_fp32(files, cli):
    reference, _ = _scores(cli, files, files / "f32.safetensors", "--device", "cpu")
    scale = max(abs(v) for v in reference)
    runs = {
        "bf16 stored": (files / "bf16.safetensors",),
        "bf16 stored, float32 compute": (files / "bf16.safetensors", "--dtype", "float32"),
        "fp32 stored, bf16 compute": (files / "f32.safetensors", "--dtype", "bf16"),
        "auto device": (files / "f32.safetensors", "--device", "auto"),
    }
    for name, args in runs.items():
        scores, artifact = _scores(cli, files, *args)
        assert all(math.isfinite(v) for v in scores), name
        # Per-head sums are float64 whatever the compute dtype: bf16 rounding stays ~0.2% of the scale.
        worst = max(abs(a - b) for a, b in zip(scores, reference)) / scale
        assert worst < (1e-3 if name == "auto device" else 2e-2), (name, worst)
        assert artifact["config"].get("dtype") == {
            "bf16 stored, float32 compute": "float32",
            "fp32 stored, bf16 compute": "bfloat16",
        }.get(name)


@pytest.mark.parametrize(("stored", "compute"), [("f32", "bfloat16"), ("bf16", "float32")])
def test_prune_compensation_keeps_the_stored_dtype_and_untouched_weights(files, cli, stored, compute):
    scores = cli(
        "score", files / f"{stored}.safetensors", "--data", files / "d.txt", "--samples", "8", "-o", files / "s.json"
    )
    assert scores.code == 0, scores.err
    out = files / f"{stored}-{compute}.safetensors"
    result = cli(
        "prune",
        "--scores",
        files / "s.json",
        "--ratio",
        "0.25",
        "--compensate",
        "lstsq",
        "--data",
        files / "d.txt",
        "--samples",
        "8",
        "--dtype",
        compute,
        "--device",
        "cpu",
        "-o",
        out,
    )
    assert result.code == 0, result.err
    assert _dtypes(out) == _dtypes(files / f"{stored}.safetensors") == {"F32" if stored == "f32" else "BF16"}
    with safe_open(str(files / f"{stored}.safetensors"), "pt") as a, safe_open(str(out), "pt") as b:
        # safe_open has keys() but no __iter__
        untouched = [k for k in a.keys() if "mlp" in k or "norm" in k or "embed" in k]  # noqa: SIM118
        assert untouched and all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in untouched)
        # safe_open has keys() but no __iter__
        o_proj = [k for k in a.keys() if "o_proj" in k]  # noqa: SIM118
        assert any(
            a.get_tensor(k).shape != b.get_tensor(k).shape or not torch.equal(a.get_tensor(k), b.get_tensor(k))
            for k in o_proj
        )
    if stored == "bf16":  # the other computing stages take the same options
        report = cli(
            "report",
            "--model",
            out,
            "--baseline",
            files / "bf16.safetensors",
            "--data",
            files / "d.txt",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--json",
            "-",
        )
        assert report.code == 0, report.err
        assert {k: json.loads(report.out)["config"][k] for k in ("device", "dtype")} == {
            "device": "cpu",
            "dtype": "float32",
        }
        sweep = cli(
            "sweep",
            files / "bf16.safetensors",
            "--data",
            files / "d.txt",
            "--eval-data",
            files / "d.txt",
            "--methods",
            "random",
            "--ratios",
            "0.25",
            "--samples",
            "8",
            "--device",
            "auto",
            "--dtype",
            "float32",
        )
        assert sweep.code == 0, sweep.err
        tuned = files / "ft.safetensors"
        finetune = cli(
            "finetune",
            out,
            "--data",
            files / "d.txt",
            "--steps",
            "1",
            "--batch-size",
            "4",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "-o",
            tuned,
        )
        assert finetune.code == 0, finetune.err
        assert _dtypes(tuned) == {"BF16"}  # float32 master weights, written back in the stored dtype


def test_place_casts_parameters_not_fp32_buffers_and_restore_gives_back_the_loaded_tensors():
    model = TINY["llama"]()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    placement = place(model, "cpu", "bfloat16", keep_originals=True)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {b.dtype for n, b in model.named_buffers() if "inv_freq" in n} == {torch.float32}
    with torch.no_grad():
        model.model.layers[0].self_attn.o_proj.weight.mul_(2)  # the one weight a stage changed
    restore(model, placement)
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32
        if name == "model.layers.0.self_attn.o_proj.weight":
            torch.testing.assert_close(p, 2 * before[name], rtol=1e-2, atol=1e-3)
        else:
            assert torch.equal(p, before[name]), name  # no round trip through bf16


def test_device_map_places_whole_blocks_over_devices():
    torch.manual_seed(0)
    config = T.LlamaConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=48,
        pad_token_id=0,
    )
    model = T.LlamaForCausalLM(config).eval()
    size = model_bytes(model)
    device_map = check_map(device_map_for(model, {0: int(0.8 * size), 1: int(0.8 * size)}))
    assert set(device_map.values()) == {0, 1}
    assert all(not k.startswith("model.layers.") or k.count(".") == 2 for k in device_map)  # no block split
    with pytest.raises(UsageError, match="does not fit the visible CUDA devices"):
        check_map(device_map_for(model, {0: size // 4, 1: size // 4}))


def test_run_config_takes_device_and_dtype_per_stage(files, monkeypatch):

    monkeypatch.chdir(files)
    cfg = {
        "model": "f32.safetensors",
        "data": "d.txt",
        "out": "out",
        "stages": [
            {"command": "score", "method": "taylor", "device": "cpu", "dtype": "bfloat16"},
            {"command": "select", "ratio": 0.25},
            {"command": "prune", "compensate": "lstsq", "device": "auto", "dtype": "float32"},
            {"command": "report", "device": "cpu", "repeats": 0},
        ],
    }
    pipeline = prepare(cfg)
    argv = {s.command: s.argv for s in pipeline.stages}
    assert argv["score"][argv["score"].index("--device") + 1] == "cpu"
    assert argv["score"][argv["score"].index("--dtype") + 1] == "bfloat16"
    assert argv["prune"][argv["prune"].index("--dtype") + 1] == "float32"
    assert "--device" in argv["report"]


def test_torchrun_rank_past_the_gpu_count_is_refused(monkeypatch):
    """Two processes per node on a one-GPU machine: rank 1 must refuse, not hang rank 0."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert resolve_device("auto") == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(UsageError, match="use at most --nproc-per-node 1"):
        resolve_device("auto")
