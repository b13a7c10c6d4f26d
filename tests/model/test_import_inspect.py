"""Import from Hugging Face folders, inspect, and the bad-input contract of both."""

import json

import pytest
import torch
import transformers as T

from headprune_cli import load, save
from headprune_cli.model.layout import info_of
from tests.support import TINY, assert_refused, model_inputs, model_output, snapshot

HF_FAMILIES = [name for name in sorted(TINY) if name != "reference"]


@pytest.mark.parametrize("name", HF_FAMILIES)
def test_imported_folder_reproduces_transformers_outputs(name, tmp_path, cli):
    model = TINY[name]()
    model.save_pretrained(tmp_path / "hf")
    result = cli("import", tmp_path / "hf", "-o", tmp_path / "m.safetensors")
    assert result.code == 0, result.err
    reference = type(model).from_pretrained(tmp_path / "hf")
    reference.eval()
    inputs = model_inputs(name)
    assert torch.equal(model_output(load(tmp_path / "m.safetensors"), inputs), model_output(reference, inputs))


def test_inspect_json_describes_a_pruned_checkpoint(tmp_path, cli):
    from headprune_cli.model.surgery import apply_plan

    model = TINY["llama-gqa"]()
    apply_plan(model, {0: [0, 1, 2, 3]}, [2])
    save(model, tmp_path / "m.safetensors")
    result = cli("inspect", tmp_path / "m.safetensors", "--json", "--seq-len", "32")
    assert result.code == 0, result.err
    facts = json.loads(result.out)
    assert facts["family"] == "llama" and facts["num_layers"] == 2
    assert facts["heads"] == {"0": [4, 5, 6, 7], "1": list(range(8))}
    assert facts["kv_heads"]["0"] == [1]
    assert facts["params"] == sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert facts["flops_per_token"] > 0 and facts["seq_len"] == 32
    assert set(facts["provenance"]) >= {"parent", "root", "plan"}
    table = cli("inspect", tmp_path / "m.safetensors")
    assert table.code == 0 and table.out == "" and "llama" in table.err


def test_import_of_a_checkpoint_copies_it(tmp_path, cli):
    save(TINY["reference"](), tmp_path / "a.safetensors")
    assert cli("import", tmp_path / "a.safetensors", "-o", tmp_path / "b.safetensors").code == 0
    assert info_of(load(tmp_path / "b.safetensors")).provenance["root"] is not None


def _with_metadata(source, target, edit):
    """A copy of checkpoint `source` at `target` whose header metadata went through `edit(meta)`."""
    raw = source.read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + header_len])
    edit(header["__metadata__"])
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    target.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + header_len :])


def _bad_files(tmp_path):
    good = tmp_path / "good.safetensors"
    save(TINY["bert"](), good)
    raw = good.read_bytes()
    (tmp_path / "text.safetensors").write_text("hello, not a model")
    (tmp_path / "truncated.safetensors").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "tiny.safetensors").write_bytes(b"\x01\x02")
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "plain.safetensors"))
    _with_metadata(
        good, tmp_path / "family.safetensors", lambda meta: meta.update({"headprune.family": "nosuchfamily"})
    )
    config = {
        **json.loads(json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])["__metadata__"]["headprune.config"]),
        "hidden_act": "no-such-act",
    }
    _with_metadata(
        good, tmp_path / "unbuildable.safetensors", lambda meta: meta.update({"headprune.config": json.dumps(config)})
    )
    (tmp_path / "noconfig").mkdir()

    def metadata(name, edit):
        _with_metadata(good, tmp_path / name, edit)

    metadata("version.safetensors", lambda meta: meta.update({"headprune.version": "99"}))
    metadata("keys.safetensors", lambda meta: meta.pop("headprune.layout"))
    metadata("config-json.safetensors", lambda meta: meta.update({"headprune.config": "{not json"}))
    metadata("layout-type.safetensors", lambda meta: meta.update({"headprune.layout": "[1, 2]"}))
    return {
        "version.safetensors": "checkpoint format version '99' is not supported (need 1)",
        "keys.safetensors": "checkpoint metadata lacks layout",
        "config-json.safetensors": "metadata 'config' is not valid JSON",
        "layout-type.safetensors": "metadata 'layout' has the wrong type",
        "text.safetensors": "not a safetensors file",
        "truncated.safetensors": "truncated",
        "tiny.safetensors": "too short",
        "plain.safetensors": "without headprune metadata",
        "family.safetensors": "unknown model family 'nosuchfamily'",
        "unbuildable.safetensors": (
            "unbuildable.safetensors: cannot build BertForSequenceClassification from the stored config"
        ),
        "noconfig": "no config.json",
        "missing.safetensors": "no such",
    }


def test_bad_checkpoints_fail_cleanly(tmp_path, cli):
    cases = _bad_files(tmp_path)
    before = snapshot(tmp_path)
    for name, message in cases.items():
        for args in (("inspect", tmp_path / name), ("import", tmp_path / name, "-o", tmp_path / "out.safetensors")):
            result = cli(*args)
            assert result.code == 1, (name, result)
            assert result.err.startswith("Error: ") and result.err.count("\n") == 1, result.err
            expected = "a folder, not a checkpoint" if (name, args[0]) == ("noconfig", "inspect") else message
            assert expected in result.err, (name, result.err)
            assert result.err.startswith(f"Error: {tmp_path / name}"), result.err  # the file is named
            assert "Traceback" not in result.err and result.out == ""
    assert snapshot(tmp_path) == before


def test_import_refuses_pickled_only_folders(tmp_path, cli):
    folder = tmp_path / "hf"
    TINY["bert"]().save_pretrained(folder)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    result = cli("import", folder, "-o", tmp_path / "m.safetensors")
    assert result.code == 1 and "pickled weights are never loaded" in result.err
    assert not (tmp_path / "m.safetensors").exists()


def test_import_never_overwrites_without_force(tmp_path, cli):
    save(TINY["reference"](), tmp_path / "a.safetensors")
    (tmp_path / "b.safetensors").write_bytes(b"keep me")
    result = cli("import", tmp_path / "a.safetensors", "-o", tmp_path / "b.safetensors")
    assert result.code == 2 and "--force" in result.err
    assert (tmp_path / "b.safetensors").read_bytes() == b"keep me"
    same = cli("import", tmp_path / "a.safetensors", "-o", tmp_path / "a.safetensors", "--force")
    assert same.code == 2 and "also an input" in same.err


def test_metadata_that_lies_about_shapes_is_refused_naming_the_file(tmp_path, cli):
    from headprune_cli.model.surgery import apply_plan

    model = TINY["bert"]()
    apply_plan(model, {0: [0]}, [])
    layout = info_of(model).layout
    layout.heads[0] = layout.kv_heads[0] = [0, 1, 2, 3]  # claims 4 heads, weights hold 3
    lie = tmp_path / "lie.safetensors"
    save(model, lie)
    wide = tmp_path / "wide.safetensors"
    config = {**info_of(model).config, "intermediate_size": 4000}
    _with_metadata(lie, wide, lambda meta: meta.update({"headprune.config": json.dumps(config)}))
    layer = "bert.encoder.layer.0.attention.output.dense.weight"
    nan = tmp_path / "nan.safetensors"
    poisoned = TINY["bert"]()
    with torch.no_grad():
        poisoned.bert.encoder.layer[1].output.dense.weight[3, 5] = float("nan")
    save(poisoned, nan)
    out = tmp_path / "out.safetensors"
    for command in (["inspect"], ["import", "-o", out]):  # inspect reads the header, import loads the weights
        run = lambda path, command=command: cli(command[0], path, *command[1:])  # noqa: E731
        assert_refused(run(lie), 1, f"{lie}: tensor '{layer}' has shape [32, 24], the layout needs [32, 32]")
        assert_refused(run(wide), 1, f"{wide}: config intermediate_size=4000 matches no stored tensor's shape")
    assert_refused(
        cli("import", nan, "-o", out),
        1,
        f"{nan}: tensor 'bert.encoder.layer.1.output.dense.weight' contains NaN or inf",
    )
    assert not out.exists()


def test_a_layout_the_model_cannot_take_is_refused_naming_the_file(tmp_path, cli):
    """Layouts that pass the header checks but not surgery: uneven GQA groups, and key/value
    heads that are not the ones the kept query heads use."""
    from headprune_cli.model.surgery import apply_plan

    model = TINY["llama-gqa"]()  # 8 query heads in 2 groups of 4
    apply_plan(model, {0: [0, 1, 2, 3]}, [])  # layer 0 keeps group 1: heads 4-7, kv head 1
    save(model, tmp_path / "p.safetensors")

    def edited(name, change):
        def edit(meta):
            layout = json.loads(meta["headprune.layout"])
            change(layout)
            meta["headprune.layout"] = json.dumps(layout)

        _with_metadata(tmp_path / "p.safetensors", tmp_path / name, edit)
        return tmp_path / name

    uneven = edited("uneven.safetensors", lambda layout: layout["heads"].__setitem__(1, [1, 2, 3, 4, 5, 6, 7]))
    wrong_kv = edited("kv.safetensors", lambda layout: layout["kv_heads"].__setitem__(0, [0]))
    for command in (["inspect"], ["import", "-o", tmp_path / "out.safetensors"]):
        assert_refused(
            cli(command[0], uneven, *command[1:]),
            1,
            f"{uneven}: its layout cannot be applied: layer 1: grouped-query attention",
        )
        assert_refused(
            cli(command[0], wrong_kv, *command[1:]),
            1,
            f"{wrong_kv}: its layout's key/value heads do not match its query heads",
        )
    assert not (tmp_path / "out.safetensors").exists()


def test_a_weights_file_safetensors_cannot_open_is_refused_naming_it(tmp_path, cli, monkeypatch):
    """Our header checks are stricter than safetensors', so this guards against what they
    may miss: safetensors' own error, on one line, with the file's name."""
    import safetensors

    save(TINY["bert"](), tmp_path / "m.safetensors")

    def corrupt(*args, **kwargs):
        raise RuntimeError("invalid offsets\nsecond line")

    monkeypatch.setattr(safetensors, "safe_open", corrupt)
    result = cli("import", tmp_path / "m.safetensors", "-o", tmp_path / "out.safetensors")
    assert_refused(result, 1, f"{tmp_path / 'm.safetensors'}: corrupt safetensors file (invalid offsets)")
    assert not (tmp_path / "out.safetensors").exists()


def test_a_checkpoint_keeps_its_tokenizer_pooling_build_options_and_provenance(tmp_path):
    """Everything `save` writes besides the weights comes back from `load`, and a child
    records its parent (relative to itself) and its plan."""
    from headprune_cli.model.checkpoint import read_info

    model = T.BertModel(
        T.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48),
        add_pooling_layer=False,
    )
    info = info_of(model)
    info.tokenizer = json.dumps(
        {"version": "1.0", "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}}
    )
    info.tokenizer_config = {"pad_token": "[PAD]", "model_max_length": 16}
    info.pooling = {"mode": "mean", "normalize": True}
    save(model, tmp_path / "m.safetensors", plan_sha="cd" * 32)
    stored = read_info(tmp_path / "m.safetensors")
    assert (stored.tokenizer, stored.tokenizer_config, stored.pooling) == (
        info.tokenizer,
        info.tokenizer_config,
        info.pooling,
    )
    assert stored.build_options == info.build_options == {"add_pooling_layer": False}
    assert stored.provenance["plan"] == "cd" * 32
    info.provenance = {"parent": None, "plan": "ab" * 32, "root": None}  # a model that never came from a file
    save(model, tmp_path / "kept.safetensors")  # keeps the plan it has when none is given
    assert read_info(tmp_path / "kept.safetensors").provenance["plan"] == "ab" * 32
    (tmp_path / "sub").mkdir()
    save(load(tmp_path / "m.safetensors"), tmp_path / "sub" / "child.safetensors", plan_sha="ef" * 32)
    child = read_info(tmp_path / "sub" / "child.safetensors").provenance
    assert child["parent_path"] == child["root_path"] == "../m.safetensors" and child["plan"] == "ef" * 32

    optional = ("tokenizer", "tokenizer_config", "pooling", "build_options", "provenance")  # older files lack them
    _with_metadata(
        tmp_path / "m.safetensors",
        tmp_path / "older.safetensors",
        lambda meta: [meta.pop(f"headprune.{k}") for k in optional],
    )
    older = read_info(tmp_path / "older.safetensors")
    assert (older.tokenizer, older.tokenizer_config, older.pooling, older.build_options, older.provenance) == (
        None,
        {},
        {},
        {},
        {},
    )


def test_save_refuses_a_model_whose_config_disagrees_with_its_layout(tmp_path):
    from headprune_cli.errors import CheckpointError

    model = TINY["bert"]()
    info_of(model).config["num_attention_heads"] = 5
    target = tmp_path / "m.safetensors"
    with pytest.raises(CheckpointError, match=f"^not writing {target}: "):
        save(model, target)
    assert not target.exists()


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("tokenizer_config", "{not json", "metadata 'tokenizer_config' is not valid JSON"),
        ("pooling", "[1]", "metadata 'pooling' has the wrong type"),
        ("build_options", "{not json", "metadata 'build_options' is not valid JSON"),
        ("provenance", "7", "metadata 'provenance' has the wrong type"),
    ],
)
def test_broken_optional_metadata_is_refused_naming_the_key_and_file(tmp_path, cli, key, value, message):
    save(TINY["bert"](), tmp_path / "good.safetensors")
    bad = tmp_path / "bad.safetensors"
    _with_metadata(tmp_path / "good.safetensors", bad, lambda meta: meta.update({f"headprune.{key}": value}))
    assert_refused(cli("inspect", bad), 1, f"{bad}: {message}")


def test_save_never_replaces_a_file_unless_asked(tmp_path):
    from headprune_cli.errors import UsageError

    target = tmp_path / "m.safetensors"
    target.write_bytes(b"the only copy")
    with pytest.raises(UsageError, match="overwrite=True"):
        save(TINY["reference"](), target)
    assert target.read_bytes() == b"the only copy"
    model = TINY["reference"]()
    save(model, target, overwrite=True)
    assert info_of(load(target)).layout.heads == info_of(model).layout.heads


def _edited_export(folder, tmp_path, name, edit):
    """A copy of the export folder with its headprune.json changed by `edit(data)` (or replaced by bytes)."""
    import shutil

    copy = tmp_path / name
    shutil.copytree(folder, copy)
    if isinstance(edit, bytes):
        (copy / "headprune.json").write_bytes(edit)
    else:
        data = json.loads((copy / "headprune.json").read_text())
        edit(data)
        (copy / "headprune.json").write_text(json.dumps(data))
    return copy


def test_an_export_folder_is_read_with_its_tokenizer_and_a_broken_one_is_refused_with_its_reason(tmp_path, cli):
    from headprune_cli.model.checkpoint import read_info
    from headprune_cli.model.formats.hf import export_hf

    model = TINY["bert"]()
    info_of(model).tokenizer = json.dumps(
        {"version": "1.0", "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}}
    )
    folder = export_hf(model, tmp_path / "good")
    assert read_info(folder).tokenizer == info_of(model).tokenizer
    cases = {
        "not-json": (
            b"{not json",
            "{dir}/headprune.json: not valid JSON (Expecting property name enclosed in double quotes",
        ),
        "format": (
            lambda d: d.update(format="something-else"),
            "{dir}/headprune.json: not a headprune export (format is not 'headprune-folder')",
        ),
        "version": (
            lambda d: d.update(version="99"),
            "{dir}/headprune.json: export format version '99' is not supported (need 1)",
        ),
        "keys": (lambda d: d.pop("layout"), "{dir}/headprune.json: export metadata lacks layout"),
        "escape": (
            lambda d: d.update(weights="../good/model.safetensors"),
            "{dir}/headprune.json: weights '../good/model.safetensors' is not one of "
            "model.safetensors, headprune.safetensors",
        ),
        "missing": (
            lambda d: d.update(weights="headprune.safetensors"),
            "{dir}: no headprune.safetensors (or headprune.safetensors.index.json)",
        ),
    }
    for name, (edit, message) in cases.items():
        broken = _edited_export(folder, tmp_path, name, edit)
        before = snapshot(tmp_path)
        assert_refused(cli("inspect", broken), 1, message.format(dir=broken))
        assert snapshot(tmp_path) == before
    older = _edited_export(folder, tmp_path, "older", lambda d: d.pop("weights"))  # folders from before the key existed
    assert info_of(load(older)).layout.heads == info_of(model).layout.heads
