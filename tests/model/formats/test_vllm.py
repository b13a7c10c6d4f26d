"""export --vllm: the nemotron-nas folder read back (config, weights, headprune's own loader) and
its refusals. vLLM itself loads these folders in tests/engines/test_vllm.py."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import transformers as T
from safetensors.torch import load_file

import headprune_cli
from headprune_cli.errors import ArchitectureError, PlanError
from headprune_cli.model.checkpoint import read_info
from headprune_cli.model.formats.vllm import CONFIG_FILE, nas_folder_config, nas_plan
from tests.support.gguf_models import ROPES, write_checkpoint
from tests.support.models import TINY
from tests.support.refusals import assert_refused, snapshot
from tests.support.vllm_models import NAS, UNEVEN_QUERY, tiny_llama32


@pytest.fixture(scope="module")
def nas(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("vllm") / "nas.safetensors", NAS, tiny_llama32())


def test_the_folder_states_every_layer_and_holds_the_checkpoints_weights(nas, tmp_path, cli):
    out = tmp_path / "served"
    result = cli("export", nas, "--vllm", out)
    assert result.code == 0, result
    assert "KV heads 2/4/2, FFN widths 256/128/173" in result.out + result.err
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "nemotron-nas" and config["architectures"] == ["DeciLMForCausalLM"]
    assert config["num_hidden_layers"] == 3 and config["num_attention_heads"] == 4 and config["head_dim"] == 32
    assert config["num_key_value_heads"] == 2  # layer 0's, as vLLM reads the top-level count
    assert type(config["num_key_value_heads"]) is int and type(config["head_dim"]) is int  # 2.0 is not 2 to vLLM
    assert config["hidden_size"] == 128 and config["vocab_size"] == 320 and config["tie_word_embeddings"] is False
    assert config["auto_map"] == {"AutoConfig": "configuration_headprune_nas.HeadpruneNasConfig"}
    blocks = config["block_configs"]
    # Each block as NVIDIA's nemotron-nas configs spell it: no_op and replace_with_linear both False
    # (a real attention and a real gated MLP), whole numbers (vLLM divides the head count by
    # n_heads_in_group), the FFN width exact: no ffn_mult, no padding.
    assert blocks == [
        {
            "attention": {"no_op": False, "replace_with_linear": False, "n_heads_in_group": group},
            "ffn": {"no_op": False, "replace_with_linear": False, "intermediate_size": width},
        }
        for group, width in ((2, 256), (1, 128), (2, 173))
    ]
    assert all(type(b["attention"]["n_heads_in_group"]) is int for b in blocks)
    assert (out / "configuration_headprune_nas.py").read_text() == CONFIG_FILE
    model = headprune_cli.load(nas)
    weights = load_file(str(out / "model.safetensors"))
    state = model.state_dict()
    assert set(weights) == set(state)
    assert all(torch.equal(weights[name], state[name]) for name in state)
    assert weights["model.layers.2.mlp.up_proj.weight"].shape == (173, 128)
    assert weights["model.layers.1.self_attn.k_proj.weight"].shape == (4 * 32, 128)
    ids = torch.tensor([[1, 5, 9, 33, 200]])
    with torch.no_grad():  # the folder loads back in headprune at the cut's exact shapes
        assert torch.equal(headprune_cli.load(out)(ids).logits, model(ids).logits)


def test_the_config_class_the_folder_ships_reads_the_blocks_as_vllm_does(nas, tmp_path, cli):
    """What vLLM's DeciLMForCausalLM reads (block.attention.n_heads_in_group, block.ffn.intermediate_size,
    no ffn_mult), through the folder's own config file, and that it serializes back to the same dicts."""
    out = tmp_path / "served"
    assert cli("export", nas, "--vllm", out).code == 0
    namespace: dict = {}
    source = (out / "configuration_headprune_nas.py").read_text()
    exec(compile(source, "configuration_headprune_nas.py", "exec"), namespace)  # our own file, just written
    config = namespace["HeadpruneNasConfig"].from_dict(json.loads((out / "config.json").read_text()))
    assert [config.num_attention_heads // b.attention.n_heads_in_group for b in config.block_configs] == [2, 4, 2]
    assert [b.ffn.intermediate_size for b in config.block_configs] == [256, 128, 173]
    assert not any(hasattr(b.ffn, "ffn_mult") for b in config.block_configs)  # DeciLM would round it up to 256s
    assert config.to_dict()["block_configs"] == json.loads((out / "config.json").read_text())["block_configs"]


def test_transformers_refuses_the_folder_instead_of_loading_wrong_shapes(nas, tmp_path, cli):
    out = tmp_path / "served"
    assert cli("export", nas, "--vllm", out).code == 0
    with pytest.raises(ValueError, match="custom code"):  # without trust_remote_code: the type is unknown
        T.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=False)
    with pytest.raises(ValueError, match="Unrecognized configuration class"):  # with it: the config, no model class
        T.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)


def test_same_input_gives_byte_identical_folders(nas, tmp_path, cli):
    for name in ("a", "b"):
        assert cli("export", nas, "--vllm", tmp_path / name).code == 0
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b")


def test_a_sharded_folder_says_so(nas, tmp_path, cli):
    result = cli("export", nas, "--vllm", tmp_path / "out", "--max-shard-size", "200KB")
    assert result.code == 0 and "model-*.safetensors shards with an index" in result.err
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()


def test_qwen2_states_its_qkv_biases(tmp_path, cli):
    source = write_checkpoint(tmp_path / "q.safetensors", NAS, tiny_llama32(T.Qwen2ForCausalLM, T.Qwen2Config))
    assert cli("export", source, "--vllm", tmp_path / "out").code == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["qkv_bias"] is True and config["attention_bias"] is False
    assert "model.layers.0.self_attn.q_proj.bias" in load_file(str(tmp_path / "out" / "model.safetensors"))


def test_refuses_per_layer_query_heads_naming_the_layer(tmp_path, cli):
    source = write_checkpoint(tmp_path / "u.safetensors", UNEVEN_QUERY, tiny_llama32())
    result = cli("export", source, "--vllm", tmp_path / "out")
    assert_refused(result, 1, "layer 1 keeps 8 query heads where layer 0 keeps 4")
    assert result.err == (
        "Error: layer 1 keeps 8 query heads where layer 0 keeps 4: vLLM's nemotron-nas reads one query-head "
        "count for every layer (KV heads and FFN widths may differ); choose the plan with `select --runtime vllm`\n"
    )
    assert not (tmp_path / "out").exists()


def test_refuses_a_layout_whose_query_heads_are_no_whole_multiple_of_its_kv_heads(nas):
    """headprune's own cuts keep whole groups; a layout written by hand may not (4 query heads over 3 KV)."""
    info = read_info(nas)
    layout = dataclasses.replace(info.layout, heads=[[0, 1, 2, 4], *info.layout.heads[1:]])
    layout.kv_heads = [[0, 1, 2], *info.layout.kv_heads[1:]]
    with pytest.raises(PlanError) as refused:
        nas_plan(dataclasses.replace(info, layout=layout))
    assert str(refused.value) == (
        "layer 0 keeps 4 query heads over 3 KV heads; vLLM needs a whole number of query heads per KV head"
    )


def test_a_heads_only_cut_states_the_configs_ffn_width_in_every_block(tmp_path, cli):
    heads_only = ({0: [4, 5, 6, 7], 1: [0, 1, 2, 3], 2: [1, 3, 5, 7], 3: [2, 3, 6, 7]}, [], {})
    source = write_checkpoint(tmp_path / "h.safetensors", heads_only, tiny_llama32())
    assert cli("export", source, "--vllm", tmp_path / "out").code == 0
    blocks = json.loads((tmp_path / "out" / "config.json").read_text())["block_configs"]
    assert [b["ffn"]["intermediate_size"] for b in blocks] == [256] * 4
    assert [b["attention"]["n_heads_in_group"] for b in blocks] == [2, 2, 1, 2]
    # read from the header alone (as `inspect` reads it), a layout with no FFN cut lists no widths
    assert read_info(source).layout.num_ffn == [] and nas_plan(read_info(source)).ffn == [256] * 4


def test_head_dim_of_a_config_that_does_not_state_it_is_hidden_over_heads(nas):
    info = read_info(nas)
    config = {k: v for k, v in info.config.items() if k != "head_dim"} | {"hidden_size": 384}
    plan = nas_plan(dataclasses.replace(info, config=config))
    assert plan.head_dim == 48 and type(plan.head_dim) is int  # 384 // 8 query heads of the source


def test_a_sliding_window_switched_off_serves(nas):
    """Qwen2 configs on the Hub state `sliding_window` beside `use_sliding_window: false` (transformers 4
    kept both; transformers 5 drops the window): only a window in use is refused."""
    info = read_info(nas)
    switched_off = info.config | {"sliding_window": 32768, "use_sliding_window": False}
    assert nas_plan(dataclasses.replace(info, config=switched_off)).heads == 4
    with pytest.raises(ArchitectureError, match="sliding window of 32768 tokens"):
        nas_plan(dataclasses.replace(info, config=switched_off | {"use_sliding_window": True}))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: TINY["bert"](), "this checkpoint is a bert"),
        (
            lambda: tiny_llama32(T.Qwen3ForCausalLM, T.Qwen3Config),
            "--vllm writes LLaMA-family causal LMs (llama, mistral, qwen2) in vLLM's nemotron-nas format; "
            "this checkpoint is a qwen3 causal-lm",
        ),
        (
            lambda: tiny_llama32(T.MistralForCausalLM, T.MistralConfig, sliding_window=64),
            "this model attends through a sliding window of 64 tokens, which vLLM's nemotron-nas layers do "
            "not; it serves in vLLM as a --uniform plain folder (export --hf)",
        ),
    ],
    ids=["encoder", "qwen3", "mistral-sliding-window"],
)
def test_refuses_what_nemotron_nas_cannot_state(tmp_path, cli, make, message):
    source = tmp_path / "m.safetensors"
    headprune_cli.save(make(), source)
    before = snapshot(tmp_path)
    result = cli("export", source, "--vllm", tmp_path / "out")
    assert_refused(result, 1, message)
    assert message in result.err  # as written: the case of vLLM, KV, FFN
    assert snapshot(tmp_path) == before


def test_inspect_and_export_say_which_engines_load_a_checkpoint(nas, tmp_path, cli):
    result = cli("inspect", nas, "--json")
    engines = json.loads(result.out)["engines"]
    assert {name: way["export"] for name, way in engines.items()} == {
        "transformers": "",
        "vllm": "--vllm",
        "llama.cpp": "--gguf",
        "onnxruntime": "--onnx",
    }
    assert "different head counts" in engines["transformers"]["why"]
    uneven = write_checkpoint(tmp_path / "u.safetensors", UNEVEN_QUERY, tiny_llama32())
    engines = json.loads(cli("inspect", uneven, "--json").out)["engines"]
    assert not engines["vllm"]["loads"] and "layer 1 keeps 8 query heads" in engines["vllm"]["why"]
    assert engines["llama.cpp"]["loads"]
    plain = write_checkpoint(tmp_path / "p.safetensors", None, tiny_llama32())
    engines = json.loads(cli("inspect", plain, "--json").out)["engines"]
    assert engines["transformers"]["export"] == engines["vllm"]["export"] == "--hf"  # a plain folder serves both
    result = cli("export", uneven, "--hf", tmp_path / "folder")
    assert result.code == 0, result
    assert "serves in: llama.cpp (export --gguf), onnxruntime (export --onnx); not in transformers, vllm" in (
        result.out + result.err
    )


@pytest.mark.parametrize("kind", sorted(ROPES))
def test_config_json_gives_transformers_rope_of_each_type(kind, tmp_path, cli):
    """vLLM reads RoPE from config.json alone (not headprune.json): the frequencies a LLaMA config
    built from that file's fields computes equal the source model's, for each RoPE type."""
    params = dict(ROPES[kind], rope_theta=ROPES[kind]["rope_theta"] * 2)  # never transformers' default theta
    model = tiny_llama32(rope_parameters=dict(params), rope_theta=params["rope_theta"])
    reference = model.model.rotary_emb.inv_freq.clone()
    source = write_checkpoint(tmp_path / "r.safetensors", NAS, model)
    assert cli("export", source, "--vllm", tmp_path / "out").code == 0
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    rope_keys = ("rope_theta", "rope_scaling", "rope_parameters")
    assert any(key in written for key in rope_keys)
    shape = {"hidden_size": 128, "num_attention_heads": 4, "head_dim": 32, "max_position_embeddings": 256}
    rebuilt = T.LlamaConfig(**shape, **{key: written[key] for key in rope_keys if key in written})
    rotary = T.models.llama.modeling_llama.LlamaRotaryEmbedding(rebuilt)
    torch.testing.assert_close(rotary.inv_freq, reference, rtol=1e-6, atol=0)


def test_config_json_carries_the_sources_model_settings(tmp_path, cli):
    """What DeciLM reads besides the blocks (activation, context, norm epsilon, special tokens,
    biases, dtype) equals the source model's own config, each set away from transformers' default."""
    settings = {
        "max_position_embeddings": 300,
        "rms_norm_eps": 2e-5,
        "bos_token_id": 3,
        "eos_token_id": 4,
        "pad_token_id": 5,
        "hidden_act": "gelu",
        "attention_bias": False,
        "mlp_bias": False,
        "dtype": "float32",
    }
    model = tiny_llama32(**settings)
    source = model.config.to_dict()
    path = write_checkpoint(tmp_path / "s.safetensors", NAS, model)
    assert cli("export", path, "--vllm", tmp_path / "out").code == 0
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    for key in (*settings, "vocab_size", "hidden_size", "tie_word_embeddings"):
        assert written[key] == source[key], key
    assert "qkv_bias" not in written  # a LLaMA's q/k/v have no bias


def test_a_transformers_4_header_keeps_its_rope_theta_and_rope_scaling(nas, tmp_path):
    """A checkpoint written under transformers 4 states RoPE as `rope_theta` + `rope_scaling`
    (no `rope_parameters`): config.json carries both, so transformers (and vLLM) compute the
    frequencies the source config does."""
    info = read_info(nas)
    config = {k: v for k, v in info.config.items() if k != "rope_parameters"}
    llama3 = {k: v for k, v in ROPES["llama3"].items() if k != "rope_theta"}
    config |= {"rope_theta": 40000.0, "rope_scaling": llama3}
    info = dataclasses.replace(info, config=config)
    written = nas_folder_config(info, nas_plan(info)).config
    assert written["rope_theta"] == 40000.0 and written["rope_scaling"] == llama3
    shape = {"hidden_size": 128, "num_attention_heads": 4, "head_dim": 32, "max_position_embeddings": 256}
    rope = {key: written[key] for key in ("rope_theta", "rope_scaling", "rope_parameters") if key in written}

    def inv_freq(**fields) -> torch.Tensor:
        return T.models.llama.modeling_llama.LlamaRotaryEmbedding(T.LlamaConfig(**shape, **fields)).inv_freq

    expected = inv_freq(rope_theta=40000.0, rope_scaling=dict(llama3))
    assert not torch.allclose(expected, inv_freq())  # neither transformers' default theta nor unscaled
    torch.testing.assert_close(inv_freq(**rope), expected, rtol=1e-6, atol=0)
