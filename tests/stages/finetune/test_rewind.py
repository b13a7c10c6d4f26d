"""Lottery tickets: `finetune --rewind-to` places the source's values at the original indices
the pruned model keeps; `--reinit` is the model's own init, deterministic per seed."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
import torch
import transformers as T
from safetensors.torch import save_file

from headprune_cli import load, save
from headprune_cli.errors import CheckpointError, UsageError
from headprune_cli.model.surgery import apply_plan
from headprune_cli.stages.finetune.rewind import Rewound, _check_roles, reinit, rewind
from tests.support import TINY

HEAD_DIM = 8  # tiny bert: hidden 32, 4 heads
# a LLaMA-shaped config for the sources of another architecture
LLAMA_SHAPE = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
KEPT_HEADS = [0, 2]  # layer 0 after removing heads 1 and 3
KEPT_NEURONS = [n for n in range(48) if n % 3 != 1]  # layer 1's FFN after the cut


def _rows(heads: list[int]) -> list[int]:
    return [h * HEAD_DIM + i for h in heads for i in range(HEAD_DIM)]


@pytest.fixture
def ticket(tmp_path: Path) -> dict:
    """base (the 'pre-trained' weights), tuned (base moved away: the 'fine-tuned' root) and
    pruned (tuned without heads 1 and 3 of layer 0, a third of layer 1's FFN, and layer 2)."""
    base = TINY["bert"]()
    tuned = copy.deepcopy(base)
    with torch.no_grad():
        for param in tuned.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    save(base, tmp_path / "base.safetensors")
    base.save_pretrained(str(tmp_path / "base-hf"))
    save(tuned, tmp_path / "tuned.safetensors")
    pruned = load(tmp_path / "tuned.safetensors")
    remove_ffn = {1: [n for n in range(48) if n not in KEPT_NEURONS]}
    apply_plan(pruned, {0: [1, 3]}, [2], remove_ffn)
    save(pruned, tmp_path / "pruned.safetensors")
    return {"base": base, "tuned": tuned, "folder": tmp_path}


def _check_rewound(model, base, tuned, tolerance: float = 0.0) -> None:
    """Layer 0's heads 0 and 2 and layer 1's kept FFN neurons hold base's values, not tuned's
    (exactly, or within `tolerance`)."""

    def same(x, y) -> bool:
        return torch.equal(x, y) if tolerance == 0 else torch.allclose(x, y, rtol=0, atol=tolerance)

    attn, src = model.bert.encoder.layer[0].attention, base.bert.encoder.layer[0].attention
    rows = _rows(KEPT_HEADS)
    for name in ("query", "key", "value"):
        mine, theirs = getattr(attn.self, name), getattr(src.self, name)
        assert mine.weight.shape[0] == 2 * HEAD_DIM
        assert same(mine.weight, theirs.weight[rows]) and same(mine.bias, theirs.bias[rows])
    # head 2 sits at position 1 now: O's columns 8..15 are base's columns 16..23
    assert same(attn.output.dense.weight[:, HEAD_DIM:], src.output.dense.weight[:, 2 * HEAD_DIM : 3 * HEAD_DIM])
    tuned_o = tuned.bert.encoder.layer[0].attention.output.dense.weight
    assert not torch.equal(attn.output.dense.weight[:, HEAD_DIM:], tuned_o[:, 2 * HEAD_DIM : 3 * HEAD_DIM])
    layer, src_layer = model.bert.encoder.layer[1], base.bert.encoder.layer[1]
    assert same(layer.intermediate.dense.weight, src_layer.intermediate.dense.weight[KEPT_NEURONS])
    assert same(layer.intermediate.dense.bias, src_layer.intermediate.dense.bias[KEPT_NEURONS])
    assert same(layer.output.dense.weight, src_layer.output.dense.weight[:, KEPT_NEURONS])
    assert len(model.bert.encoder.layer) == 2
    assert same(model.bert.embeddings.word_embeddings.weight, base.bert.embeddings.word_embeddings.weight)


@pytest.mark.parametrize("source", ["base.safetensors", "base-hf"])
def test_rewind_places_the_source_values_at_the_original_indices(ticket, source):
    folder = ticket["folder"]
    model = load(folder / "pruned.safetensors")
    done = rewind(model, folder / source)
    _check_rewound(model, ticket["base"], ticket["tuned"])
    assert torch.equal(model.classifier.weight, ticket["base"].classifier.weight)  # the same class: the head too
    assert done.kept == [] and done.copied == len(model.state_dict())
    assert done.sha256 in {
        __import__("hashlib").sha256(p.read_bytes()).hexdigest()
        for p in [folder / "base.safetensors", *(folder / "base-hf").glob("*.safetensors")]
    }


def test_a_bare_encoder_source_keeps_the_task_head(ticket):
    """Rewinding a classifier to its base model (no classifier) keeps the pruned model's head."""
    folder = ticket["folder"]
    ticket["base"].bert.save_pretrained(str(folder / "encoder-hf"))
    model = load(folder / "pruned.safetensors")
    tuned_head = model.classifier.weight.clone()
    done = rewind(model, folder / "encoder-hf")
    _check_rewound(model, ticket["base"], ticket["tuned"])
    assert torch.equal(model.classifier.weight, tuned_head)
    assert done.kept == ["classifier.bias", "classifier.weight"]
    assert "classifier.bias, classifier.weight" in done.summary("ab" * 32)


def test_rewound_model_runs_like_the_source_gated(ticket):
    """The rewound pruned model equals the source with the same heads gated off (its logits)."""
    from headprune_cli.model.surgery import apply_plan as cut

    folder = ticket["folder"]
    model = load(folder / "pruned.safetensors")
    rewind(model, folder / "base.safetensors")
    reference = load(folder / "base.safetensors")
    cut(reference, {0: [1, 3]}, [2], {1: [n for n in range(48) if n not in KEPT_NEURONS]})
    ids = torch.randint(2, 60, (3, 7), generator=torch.Generator().manual_seed(1))
    assert torch.equal(model(input_ids=ids).logits, reference(input_ids=ids).logits)


def test_finetune_rewinds_before_it_trains(ticket, cli):
    """`finetune --rewind-to` with a learning rate too small to move a weight: the output is
    the rewound model, and the summary names the source's sha256."""
    folder = ticket["folder"]
    ids = torch.randint(2, 60, (8, 6), generator=torch.Generator().manual_seed(2))
    data = folder / "train.safetensors"
    save_file({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids[:, 0] % 3}, str(data))
    out = folder / "ft.safetensors"
    res = cli(
        "finetune",
        folder / "pruned.safetensors",
        "--data",
        data,
        "--steps",
        "1",
        "--lr",
        "1e-30",
        "--rewind-to",
        folder / "base.safetensors",
        "-o",
        out,
    )
    assert res.code == 0, res.err
    sha = __import__("hashlib").sha256((folder / "base.safetensors").read_bytes()).hexdigest()
    assert f"weights sha256 {sha[:12]}" in res.err
    _check_rewound(load(out), ticket["base"], ticket["tuned"], tolerance=1e-25)  # one Adam step of 1e-30


def test_reinit_is_the_models_init_and_deterministic_per_seed(ticket):
    folder = ticket["folder"]
    first, again, other = (load(folder / "pruned.safetensors") for _ in range(3))
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    reinit(first, 7)
    assert torch.equal(torch.rand(3), expected_next)  # the global random state is untouched
    reinit(again, 7)
    reinit(other, 8)
    a, b, c = first.state_dict(), again.state_dict(), other.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    weight = "bert.encoder.layer[0].attention.self.query.weight".replace("[0]", ".0")
    assert not torch.equal(a[weight], c[weight])
    assert a[weight].shape == (2 * HEAD_DIM, 32)  # the kept structure
    assert abs(a[weight].std().item() - 0.02) < 0.01  # BERT's init: normal(0, initializer_range)
    norm = "bert.encoder.layer.0.attention.output.LayerNorm.weight"
    assert torch.equal(a[norm], torch.ones_like(a[norm]))
    assert not torch.equal(a[weight], ticket["tuned"].state_dict()[weight][_rows(KEPT_HEADS)])


def test_reinit_of_the_reference_encoder_uses_torch_init():
    model = TINY["reference"]()
    apply_plan(model, {0: [1, 3]}, [])
    twin = copy.deepcopy(model)
    reinit(model, 3)
    reinit(twin, 3)
    assert all(torch.equal(x, y) for x, y in zip(model.state_dict().values(), twin.state_dict().values()))
    before = TINY["reference"]().layers[0].attention.q_proj.weight  # heads 0 and 2 of 4, head_dim 8
    assert not torch.equal(model.layers[0].attention.q_proj.weight, before[[*range(8), *range(16, 24)]])


def test_rewind_to_a_gqa_model_slices_kv_groups(tmp_path):
    """LLaMA with grouped-query attention: a removed KV group takes its query heads along,
    and the kept group's K/V rows come from the source."""
    config = T.LlamaConfig(
        vocab_size=60,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    base = T.LlamaForCausalLM(config).eval()
    tuned = copy.deepcopy(base)
    with torch.no_grad():
        for param in tuned.parameters():
            param.add_(0.1)
    save(base, tmp_path / "base.safetensors")
    apply_plan(tuned, {1: [0, 1]}, [])  # layer 1 loses KV group 0 (query heads 0 and 1)
    rewind(tuned, tmp_path / "base.safetensors")
    attn, src = tuned.model.layers[1].self_attn, base.model.layers[1].self_attn
    assert torch.equal(attn.k_proj.weight, src.k_proj.weight[8:16])  # head_dim 8: KV head 1
    assert torch.equal(attn.q_proj.weight, src.q_proj.weight[16:32])  # query heads 2 and 3
    assert torch.equal(attn.o_proj.weight, src.o_proj.weight[:, 16:32])


def test_rewind_onto_a_partly_pruned_source_reads_each_layer_by_its_original_index(tmp_path):
    """The source already lost head 3 of layer 2 and some of layer 2's neurons; the model dropped
    layer 1 and keeps heads 0 and 2 of layer 2 (position 1 now): each kept unit gets the source's
    value of the same original layer and head, not of the layer at the same position."""
    base = TINY["bert"]()
    source = copy.deepcopy(base)
    apply_plan(source, {2: [3]}, [], {2: list(range(40, 48))})
    save(source, tmp_path / "source.safetensors")
    tuned = copy.deepcopy(base)
    with torch.no_grad():
        for param in tuned.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    apply_plan(tuned, {0: [1], 2: [1, 3]}, [1], {2: list(range(24, 48))})
    save(tuned, tmp_path / "pruned.safetensors")
    model = load(tmp_path / "pruned.safetensors")
    rewind(model, tmp_path / "source.safetensors")
    assert len(model.bert.encoder.layer) == 2
    for pos, layer, heads in ((0, 0, [0, 2, 3]), (1, 2, [0, 2])):
        mine, theirs = model.bert.encoder.layer[pos], base.bert.encoder.layer[layer]
        rows = _rows(heads)
        for name in ("query", "key", "value"):
            assert torch.equal(
                getattr(mine.attention.self, name).weight, getattr(theirs.attention.self, name).weight[rows]
            )
        assert torch.equal(mine.attention.output.dense.weight, theirs.attention.output.dense.weight[:, rows])
    mine, theirs = model.bert.encoder.layer[1], base.bert.encoder.layer[2]
    assert torch.equal(mine.intermediate.dense.weight, theirs.intermediate.dense.weight[:24])
    assert torch.equal(mine.output.dense.weight, theirs.output.dense.weight[:, :24])


# --- what rewind reports, and what it refuses, by the exact line -------------------------------
def test_the_summary_names_the_source_its_hash_its_root_and_what_it_kept():
    done = Rewound("base.safetensors", "a" * 12 + "b" * 52, 17, ["classifier.bias", "classifier.weight"])
    assert done.summary("c" * 12 + "d" * 52) == (
        "rewound 17 tensors (the kept heads, FFN neurons and layers, by original index) to base.safetensors "
        "(weights sha256 aaaaaaaaaaaa; its root model is cccccccccccc); kept from the pruned model (absent in "
        "the source): classifier.bias, classifier.weight"
    )
    assert Rewound("b", "e" * 64, 3).summary(None) == (
        "rewound 3 tensors (the kept heads, FFN neurons and layers, by original index) to b "
        "(weights sha256 eeeeeeeeeeee; it is a root model)"
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_rewind_reports_the_source_its_weights_hash_and_what_it_copied(ticket):
    folder = ticket["folder"]
    model = load(folder / "pruned.safetensors")
    done = rewind(model, folder / "base.safetensors")
    assert (done.source, done.sha256) == (str(folder / "base.safetensors"), _sha256(folder / "base.safetensors"))
    assert (done.copied, done.kept) == (len(model.state_dict()), [])
    one = rewind(load(folder / "pruned.safetensors"), folder / "base-hf")
    assert (one.source, one.sha256) == (str(folder / "base-hf"), _sha256(folder / "base-hf" / "model.safetensors"))
    # a folder of several safetensors files: the sha256 of their sorted "name sha256" lines
    ticket["base"].save_pretrained(str(folder / "sharded"), max_shard_size="20KB")
    files = sorted((folder / "sharded").glob("*.safetensors"))
    assert len(files) > 1
    listing = "\n".join(f"{f.name} {_sha256(f)}" for f in files).encode()
    assert rewind(load(folder / "pruned.safetensors"), folder / "sharded").sha256 == hashlib.sha256(listing).hexdigest()


def test_a_bare_encoder_source_copies_every_tensor_but_the_task_head(ticket):
    folder = ticket["folder"]
    save(ticket["base"].bert, folder / "encoder.safetensors")
    model = load(folder / "pruned.safetensors")
    done = rewind(model, folder / "encoder.safetensors")
    head = ["classifier.bias", "classifier.weight"]
    assert (done.copied, done.kept) == (len(model.state_dict()) - 2, head)


def _refusal(model, source) -> str:
    with pytest.raises(UsageError) as refused:
        rewind(model, source)
    return str(refused.value)


def test_a_source_of_another_family_architecture_or_shape_is_refused_naming_it(ticket):
    folder = ticket["folder"]
    model = load(folder / "pruned.safetensors")
    save(TINY["llama"](), folder / "llama.safetensors")
    assert _refusal(model, folder / "llama.safetensors") == (
        f"--rewind-to {folder / 'llama.safetensors'} is a llama model; the model to rewind is bert"
    )
    save(T.LlamaForCausalLM(T.LlamaConfig(**LLAMA_SHAPE)), folder / "l.safetensors")
    save(T.Qwen3ForCausalLM(T.Qwen3Config(**LLAMA_SHAPE, head_dim=8)), folder / "q.safetensors")
    assert _refusal(load(folder / "l.safetensors"), folder / "q.safetensors") == (
        f"--rewind-to {folder / 'q.safetensors'} is a 'qwen3' model; the model to rewind is 'llama' "
        "(rewind needs the same architecture)"
    )
    other = {**ticket["base"].config.to_dict(), "intermediate_size": 64, "vocab_size": 70}
    T.BertForSequenceClassification(T.BertConfig(**other)).save_pretrained(str(folder / "wide-hf"))
    assert _refusal(model, folder / "wide-hf") == (
        f"--rewind-to {folder / 'wide-hf'} has another architecture or shape than the model to rewind "
        "(intermediate_size 64 vs 48; vocab_size 70 vs 60)"
    )


def test_a_shape_key_one_config_does_not_state_is_not_compared(ticket):
    folder = ticket["folder"]
    config = json.loads((folder / "base-hf" / "config.json").read_text())
    del config["type_vocab_size"]  # transformers' default (2) is the model's
    (folder / "base-hf" / "config.json").write_text(json.dumps(config))
    model = load(folder / "pruned.safetensors")
    rewind(model, folder / "base-hf")
    _check_rewound(model, ticket["base"], ticket["tuned"])


def test_a_source_that_lacks_what_the_model_keeps_is_refused_naming_the_first_unit(ticket):
    folder = ticket["folder"]
    model = load(folder / "pruned.safetensors")  # keeps heads 0, 2 of layer 0, 32 neurons of layer 1, layers 0-1
    for name, heads, layers, ffn, what in (
        ("no-head", {0: [2]}, [], {}, "layer 0 heads [2]"),
        ("no-layer", {}, [1], {}, "layer 1"),
        ("no-neurons", {}, [], {1: [0, 2, 3, 4]}, "layer 1: 3 FFN neurons"),  # 4 is cut already
    ):
        source = copy.deepcopy(ticket["base"])
        apply_plan(source, heads, layers, ffn)
        save(source, folder / f"{name}.safetensors")
        assert _refusal(model, folder / f"{name}.safetensors") == (
            f"--rewind-to {folder / name}.safetensors lacks what the model keeps ({what}); "
            "rewind to a less pruned model"
        )


def test_a_source_with_tensors_the_model_has_no_place_for_is_refused(tmp_path):
    save(T.LlamaForCausalLM(T.LlamaConfig(**LLAMA_SHAPE)), tmp_path / "plain.safetensors")
    save(T.LlamaForCausalLM(T.LlamaConfig(**LLAMA_SHAPE, attention_bias=True)), tmp_path / "biased.safetensors")
    assert _refusal(load(tmp_path / "plain.safetensors"), tmp_path / "biased.safetensors") == (
        f"--rewind-to {tmp_path / 'biased.safetensors'} has tensors the model to rewind has no place for "
        "(model.layers.0.self_attn.k_proj.bias and 7 more); rewind needs the same architecture"
    )


def test_a_folder_whose_config_cannot_be_read_is_refused_as_the_rewind_source(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError) as refused:
        rewind(TINY["bert"](), tmp_path / "hf")
    assert str(refused.value) == (
        f"--rewind-to {tmp_path / 'hf' / 'config.json'}: not valid JSON "
        "(Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"
    )


def test_tensors_with_no_place_are_named_first_then_counted():
    t = torch.zeros(1)
    with pytest.raises(UsageError) as refused:
        _check_roles({"a": t, "b": t}, {"a": t}, "src")
    assert str(refused.value) == (
        "--rewind-to src has tensors the model to rewind has no place for (b); rewind needs the same architecture"
    )
    with pytest.raises(UsageError) as refused:
        _check_roles({"d": t, "c": t}, {}, "src")
    assert str(refused.value).startswith(
        "--rewind-to src has tensors the model to rewind has no place for (c and 1 more)"
    )
    with pytest.raises(UsageError) as refused:
        _check_roles({"d": t, "c": t, "e": t}, {}, "src")
    assert str(refused.value).startswith(
        "--rewind-to src has tensors the model to rewind has no place for (c and 2 more)"
    )
    _check_roles({"a": t}, {"a": t, "b": t}, "src")  # the model may hold more than the source


def test_a_bare_encoder_rewound_to_a_classifier_takes_its_encoder(ticket):
    folder = ticket["folder"]
    save(ticket["tuned"].bert, folder / "encoder.safetensors")
    model = load(folder / "encoder.safetensors")
    done = rewind(model, folder / "base.safetensors")  # a classifier: its head has no counterpart, nor is needed
    assert (done.copied, done.kept) == (len(model.state_dict()), [])
    want = ticket["base"].bert.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in model.state_dict().items())
