"""LLM-scale loading and streaming, shown on tiny configs: a checkpoint is read tensor by tensor,
never whole, and what is loaded, pruned and written back matches the in-memory path.

Memory and time at 1.1 B parameters are measured by scripts/benchmarks/large.py, not here.
"""

import hashlib
import json
import re

import pytest
import torch
import transformers as T

from headprune_cli import load, save
from headprune_cli.model import checkpoint, tensorfile
from headprune_cli.model.describe import describe
from headprune_cli.model.formats.hf import export_hf
from headprune_cli.model.streaming import prune_file
from headprune_cli.model.surgery import HeadGates, apply_plan, removal_gates
from tests.support import TINY, model_inputs, model_output, snapshot
from tests.support import gqa_plan as _plan


def _hf_bf16(name, folder, **save_options):
    model = TINY[name]().to(torch.bfloat16)
    model.save_pretrained(folder, **save_options)
    reference = type(model).from_pretrained(folder)
    reference.eval()
    return reference


@pytest.mark.parametrize("name", ["llama-gqa", "qwen3", "gpt2", "bert"])
def test_load_of_imported_bf16_model_equals_from_pretrained_bit_for_bit(name, tmp_path, cli):
    reference = _hf_bf16(name, tmp_path / "hf")
    assert cli("import", tmp_path / "hf", "-o", tmp_path / "m.safetensors").code == 0
    model = load(tmp_path / "m.safetensors")
    ours, theirs = model.state_dict(), reference.state_dict()
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), key
    buffers, expected = dict(model.named_buffers()), dict(reference.named_buffers())
    assert sorted(buffers) == sorted(expected)
    for key, value in expected.items():  # non-persistent buffers (RoPE inv_freq) too, in their dtype
        assert buffers[key].dtype == value.dtype and torch.equal(buffers[key], value), key
    if name != "gpt2" and name != "bert":
        assert buffers["model.rotary_emb.inv_freq"].dtype == torch.float32
        assert model.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    inputs = model_inputs(name)
    assert torch.equal(model_output(model, inputs), model_output(reference, inputs))


def test_pruned_bf16_llama_equals_the_gated_original_in_fp32(tmp_path):
    reference = _hf_bf16("llama-gqa", tmp_path / "hf")
    save(reference, tmp_path / "m.safetensors")
    heads, _ = _plan(reference)
    prune_file(tmp_path / "m.safetensors", tmp_path / "p.safetensors", heads, [])
    pruned = load(tmp_path / "p.safetensors")
    assert pruned.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    original = load(tmp_path / "m.safetensors").float()
    inputs = model_inputs("llama-gqa")
    with HeadGates(original, removal_gates(original, heads)):
        gated = model_output(original, inputs)
    assert torch.allclose(model_output(pruned.float(), inputs), gated, atol=1e-5, rtol=0)


def test_load_builds_on_the_meta_device_and_maps_the_file(tmp_path, monkeypatch):
    save(TINY["llama"]().to(torch.bfloat16), tmp_path / "m.safetensors")
    built = []
    original = checkpoint.build_empty

    def spy(build, dtype):
        model = original(build, dtype)
        built.append((dtype, {p.device.type for p in model.parameters()}))
        return model

    monkeypatch.setattr(checkpoint, "build_empty", spy)
    model = load(tmp_path / "m.safetensors")
    assert built == [(torch.bfloat16, {"meta"})]  # no weight was allocated or initialised
    mapped = []
    with open("/proc/self/maps") as handle:
        for line in handle:
            if line.rstrip().endswith(str(tmp_path / "m.safetensors")):
                start, end = (int(x, 16) for x in line.split()[0].split("-"))
                mapped.append((start, end))
    pointer = model.model.layers[0].mlp.up_proj.weight.data_ptr()
    assert any(start <= pointer < end for start, end in mapped)  # the weight lives in the mapping


def test_gpt2_lm_head_stays_tied_to_the_embedding(tmp_path):
    save(TINY["gpt2"](), tmp_path / "m.safetensors")
    names = set(tensorfile.read_entries(tmp_path / "m.safetensors"))
    assert len(names & {"lm_head.weight", "transformer.wte.weight"}) == 1  # stored once
    model = load(tmp_path / "m.safetensors")
    assert model.lm_head.weight is model.transformer.wte.weight
    assert not any(p.is_meta for p in model.parameters())


def test_sharded_folder_imports(tmp_path, cli):
    reference = _hf_bf16("llama-gqa", tmp_path / "hf", max_shard_size="20KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "hf").glob("model-*.safetensors"))) > 1
    assert cli("import", tmp_path / "hf", "-o", tmp_path / "m.safetensors").code == 0
    inputs = model_inputs("llama-gqa")
    assert torch.equal(model_output(load(tmp_path / "m.safetensors"), inputs), model_output(reference, inputs))


def test_export_hf_shards_above_max_shard_size(tmp_path, cli):
    save(TINY["llama-gqa"]().to(torch.bfloat16), tmp_path / "m.safetensors")
    result = cli("export", tmp_path / "m.safetensors", "--hf", tmp_path / "out", "--max-shard-size", "20KB")
    assert result.code == 0, result.err
    shards = sorted(p.name for p in (tmp_path / "out").glob("model-*.safetensors"))
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert len(shards) > 1 and sorted(set(index["weight_map"].values())) == shards
    assert not (tmp_path / "out" / "model.safetensors").exists()
    for shard in shards:  # every shard within the limit unless one tensor alone exceeds it
        entries = tensorfile.read_header(tmp_path / "out" / shard)[1].values()
        assert len(entries) == 1 or sum(e.nbytes for e in entries) <= 20_000
    inputs = model_inputs("llama-gqa")
    want = model_output(load(tmp_path / "m.safetensors"), inputs)
    assert torch.equal(model_output(load(tmp_path / "out"), inputs), want)
    served = T.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()  # transformers reads the shards
    assert torch.equal(model_output(served, inputs), want)
    assert cli("import", tmp_path / "out", "-o", tmp_path / "again.safetensors").code == 0
    _weights_sha_follows_every_shard(tmp_path / "out", shards)
    bad = cli("export", tmp_path / "m.safetensors", "--hf", tmp_path / "x", "--max-shard-size", "lots")
    assert bad.code == 2 and "--max-shard-size" in bad.err and not (tmp_path / "x").exists()


def _weights_sha_follows_every_shard(folder, shards):
    """A sharded folder's weights hash (what provenance and `--baseline auto` check) changes
    when any shard's bytes change, the index staying the same."""
    index = folder / "model.safetensors.index.json"
    digest = checkpoint.weights_sha(folder)
    assert digest != hashlib.sha256(index.read_bytes()).hexdigest()
    for shard in shards:
        original = (folder / shard).read_bytes()
        (folder / shard).write_bytes(original[:-1] + bytes([original[-1] ^ 1]))  # one bit of the last tensor
        assert checkpoint.weights_sha(folder) != digest, shard
        (folder / shard).write_bytes(original)
    assert checkpoint.weights_sha(folder) == digest


def test_sharded_export_of_an_uneven_layout_hides_its_shards_from_transformers(tmp_path, cli):
    """Layers keeping different head counts: no transformers config states them, so the
    shards and index take names from_pretrained never looks for, and headprune reads them."""
    model = TINY["llama-gqa"]().to(torch.bfloat16)
    heads, _ = _plan(model)
    save(apply_plan(model, {0: heads[0]}, []), tmp_path / "m.safetensors")  # layer 0 alone loses a KV group
    result = cli("export", tmp_path / "m.safetensors", "--hf", tmp_path / "out", "--max-shard-size", "20KB")
    assert result.code == 0, result.err
    assert "transformers cannot load it" in result.err
    out = tmp_path / "out"
    shards = sorted(p.name for p in out.glob("headprune-*.safetensors"))
    index = json.loads((out / "headprune.safetensors.index.json").read_text())
    assert len(shards) > 1 and sorted(set(index["weight_map"].values())) == shards
    assert not list(out.glob("model*.safetensors*"))  # nothing transformers would load
    inputs = model_inputs("llama-gqa")
    want = model_output(load(tmp_path / "m.safetensors"), inputs)
    assert torch.equal(model_output(load(out), inputs), want)
    with pytest.raises(OSError):
        T.AutoModelForCausalLM.from_pretrained(out, ignore_mismatched_sizes=True)
    assert cli("import", out, "-o", tmp_path / "again.safetensors").code == 0
    assert torch.equal(model_output(load(tmp_path / "again.safetensors"), inputs), want)


@pytest.mark.parametrize("name", sorted(TINY))
def test_streamed_prune_writes_the_bytes_of_the_in_memory_path(name, tmp_path, monkeypatch):
    save(TINY[name](), tmp_path / "m.safetensors")
    model = load(tmp_path / "m.safetensors")
    heads, layers = _plan(model)
    save(apply_plan(model, heads, layers), tmp_path / "memory.safetensors", plan_sha="ab" * 32)

    def no_model(*args):
        raise AssertionError("the streamed path must not materialise the model")

    monkeypatch.setattr(checkpoint, "fill", no_model)
    digest = prune_file(
        tmp_path / "m.safetensors", tmp_path / "streamed.safetensors", heads, layers, plan_sha="ab" * 32
    )
    written = (tmp_path / "streamed.safetensors").read_bytes()
    assert written == (tmp_path / "memory.safetensors").read_bytes()
    assert digest == hashlib.sha256(written).hexdigest()  # hashed while writing, checked on the bytes


def test_write_file_returns_the_sha256_of_the_bytes_it_wrote(tmp_path):
    """Many tensors of mixed sizes and dtypes, so the hashing thread lags the writer."""
    generator = torch.Generator().manual_seed(0)
    specs = [
        tensorfile.Spec(f"t{i}", dtype, (n,), lambda n=n, dtype=dtype: torch.randn(n, generator=generator).to(dtype))
        for i, (n, dtype) in enumerate(
            [(0, torch.float32), (3, torch.bfloat16), (1 << 20, torch.float32), (7, torch.float16)] * 5
        )
    ]
    digest = tensorfile.write_file(tmp_path / "t.safetensors", specs, {"k": "v"})
    assert digest == hashlib.sha256((tmp_path / "t.safetensors").read_bytes()).hexdigest()
    model = TINY["bert"]()
    assert (
        save(model, tmp_path / "m.safetensors") == hashlib.sha256((tmp_path / "m.safetensors").read_bytes()).hexdigest()
    )


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "bert", "reference"])
def test_streamed_export_writes_the_folder_of_the_in_memory_path(name, tmp_path, cli):
    model = TINY[name]()
    heads, layers = _plan(model)
    save(apply_plan(model, heads, layers), tmp_path / "m.safetensors")
    export_hf(load(tmp_path / "m.safetensors"), tmp_path / "memory")
    assert cli("export", tmp_path / "m.safetensors", "--hf", tmp_path / "streamed").code == 0
    assert snapshot(tmp_path / "streamed") == snapshot(tmp_path / "memory")


def test_inspect_reads_no_weight(tmp_path, cli, monkeypatch):
    model = TINY["llama-gqa"]()
    save(apply_plan(model, {0: [0, 1, 2, 3]}, [2]), tmp_path / "m.safetensors")
    want = describe(load(tmp_path / "m.safetensors"), 32)
    table_before = cli("inspect", tmp_path / "m.safetensors", "--seq-len", "32")

    def refuse(*args, **kwargs):
        raise AssertionError("inspect must read the header only")

    import safetensors
    import safetensors.torch

    hashers = (
        (checkpoint, "hash_ahead"),
        (checkpoint, "weights_sha"),
        (checkpoint, "sha256_file"),
    )  # no pass over the weights to hash them
    for target, attr in (
        (safetensors, "safe_open"),
        (safetensors.torch, "load_file"),
        (tensorfile, "read_tensor"),
        (checkpoint, "fill"),
        *hashers,
    ):
        monkeypatch.setattr(target, attr, refuse)
    result = cli("inspect", tmp_path / "m.safetensors", "--json", "--seq-len", "32")
    assert result.code == 0, result.err
    facts = json.loads(result.out)
    engines = facts.pop("engines")  # which engines load it: from the layout, no weight either
    assert facts == json.loads(json.dumps(want))
    assert set(engines) == {"transformers", "vllm", "llama.cpp", "onnxruntime"}
    table = cli("inspect", tmp_path / "m.safetensors", "--seq-len", "32")
    assert table.code == 0 and table.err == table_before.err and re.search(r"\d+/\d+ heads", table.err)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float8_e5m2, torch.float8_e4m3fn]
)
def test_all_finite_finds_one_bad_element_anywhere(dtype):
    """The NaN/inf check every loaded and streamed tensor goes through, against isfinite in float64."""
    from headprune_cli.model.materialize import all_finite

    clean = torch.linspace(-3, 3, 3_000_001).to(dtype)
    assert all_finite(clean) and all_finite(clean[:0])
    bads = (
        [float("nan"), float("inf"), -float("inf")] if dtype != torch.float8_e4m3fn else [float("nan")]
    )  # e4m3fn has no inf
    for bad in bads:
        for position in (0, 1_048_577, 3_000_000):
            tensor = clean.clone()
            tensor[position] = bad
            assert not torch.isfinite(tensor.double()).all()  # the independent truth
            assert not all_finite(tensor), (bad, position)
    assert all_finite(torch.arange(10))  # integer buffers hold no NaN
