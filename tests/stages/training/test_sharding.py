"""sharding.py function by function, in this process: a gloo group of one rank, on which FSDP2
and torch.distributed.checkpoint run the same code as under torchrun without its processes
(test_fsdp.py checks two torchrun processes against one, end to end)."""

from __future__ import annotations

import errno
import json

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.fsdp import FSDPModule

from headprune_cli import load
from headprune_cli.errors import HeadpruneError, UsageError
from headprune_cli.files.outputs import MARKER
from headprune_cli.runtime.distributed import Dist
from headprune_cli.stages.training import sharding
from tests.support import TINY
from tests.support.scores import saved_model

UNITS = 3 + 1  # llama-gqa's three blocks, then the root


@pytest.fixture
def rank0(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        yield Dist(rank=0, world=1)
    finally:
        dist.destroy_process_group()


@pytest.fixture
def checkpoint(tmp_path):
    return saved_model(tmp_path, "llama-gqa")[1]


def _trained_one_step(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(input_ids=torch.arange(12).reshape(2, 6)).logits.square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    return optimizer


def _local(state: dict) -> dict:
    """Each sharded tensor's local piece (the whole tensor in a world of one), cloned."""
    return {k: (v.to_local() if hasattr(v, "to_local") else v).detach().clone() for k, v in state.items()}


def test_the_plan_is_the_world_size_and_one_unit_per_block_plus_the_root(checkpoint):
    assert sharding.plan(load(checkpoint), 3) == {"world": 3, "units": UNITS}


def test_fsdp_is_refused_outside_a_process_group_and_beside_lora():  # no "torchrun": mutation.sh deselects those names
    with pytest.raises(UsageError) as refused:
        sharding.check_fsdp(Dist(world=1), lora=False)
    assert str(refused.value) == "--fsdp shards over torchrun's processes; start it with torchrun --nproc-per-node N"
    with pytest.raises(UsageError) as refused:
        sharding.check_fsdp(Dist(world=2), lora=True)
    assert str(refused.value) == (
        "--fsdp trains every weight; --lora trains adapters in one process (drop one of them)"
    )
    sharding.check_fsdp(Dist(world=2), lora=False)


def test_every_block_then_the_root_is_sharded_and_gathers_back_to_the_same_model(rank0, checkpoint):
    original = load(checkpoint)
    model = load(checkpoint)
    ids = torch.arange(12).reshape(2, 6)
    sharding.shard(model, rank0)
    assert all(isinstance(block, FSDPModule) for block in model.model.layers) and isinstance(model, FSDPModule)
    assert not isinstance(model.model.embed_tokens, FSDPModule)  # the root's unit holds it
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, original(input_ids=ids).logits, rtol=0, atol=1e-6)
    plain = sharding.gathered(model, rank0)
    assert not isinstance(plain, FSDPModule) and not plain.training and plain.headprune is model.headprune
    want, got = original.state_dict(), plain.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    buffers = dict(plain.named_buffers())  # RoPE's inv_freq: not in the checkpoint, taken from the model
    assert buffers and all(torch.equal(b, dict(original.named_buffers())[k]) for k, b in buffers.items())
    assert sharding.gathered(model, Dist(rank=1, world=1)) is None  # only rank 0 holds the copy


def test_a_model_of_two_dtypes_or_never_saved_is_refused(rank0, checkpoint):
    mixed = load(checkpoint)
    mixed.lm_head.to(torch.float16)
    with pytest.raises(UsageError) as refused:
        sharding.shard(mixed, rank0)
    assert str(refused.value) == "--fsdp needs one parameter dtype; this model mixes ['torch.float16', 'torch.float32']"
    unsaved = TINY["llama-gqa"]()
    sharding.shard(unsaved, rank0)
    with pytest.raises(HeadpruneError) as refused:
        sharding.gathered(unsaved, rank0)
    assert str(refused.value) == ("--fsdp: the model was not loaded from a checkpoint file, so it cannot be gathered")


def test_a_saved_state_restores_weights_moments_best_and_the_random_stream(rank0, checkpoint, tmp_path):
    model = load(checkpoint)
    sharding.shard(model, rank0)
    optimizer = _trained_one_step(model)
    layout = sharding.plan(model, 1)
    folder = tmp_path / "state"
    sharding.save_state(folder, 3, model, optimizer, {"lr": 0.5}, None, rank0, layout)
    best = _local(get_model_state_dict(model))
    sharding.save_state(folder, 7, model, optimizer, {"lr": 0.25}, get_model_state_dict(model), rank0, layout)
    weights = _local(get_model_state_dict(model))
    moments = {k: _local(v) for k, v in optimizer.state_dict()["state"].items()}
    draws = torch.rand(4)
    # the older step is gone, no temporary is left, and the folder is marked as headprune's
    assert sorted(p.name for p in folder.iterdir()) == [MARKER, "latest.json", "step-00000007"]
    assert json.loads((folder / "latest.json").read_text()) == {"step": 7, "folder": "step-00000007"}

    found, state = sharding.read_state(folder, layout)
    assert found == folder / "step-00000007"
    files = {p.name: p.stat().st_size for p in found.iterdir() if p.name != "state.json"}
    assert "rng-0.safetensors" in files and ".metadata" in files
    assert state == {"lr": 0.25, "step": 7, "plan": layout, "has_best": True, "files": files}

    torch.rand(4)  # the stream moves on, and the weights, moments and best move away
    _trained_one_step(model).step()
    best_like = {k: torch.zeros_like(v) for k, v in get_model_state_dict(model).items()}
    restored = sharding.load_state(found, state, model, optimizer, rank0, best_like)

    assert all(torch.equal(v, weights[k]) for k, v in _local(get_model_state_dict(model)).items())
    now = optimizer.state_dict()["state"]
    assert all(torch.equal(_local(now[k])[name], t) for k, v in moments.items() for name, t in v.items())
    assert all(torch.equal(v, best[k]) for k, v in _local(restored).items())
    assert torch.equal(torch.rand(4), draws)


def test_a_state_saved_without_best_restores_none(rank0, checkpoint, tmp_path):
    model = load(checkpoint)
    sharding.shard(model, rank0)
    optimizer = _trained_one_step(model)
    sharding.save_state(tmp_path / "s", 1, model, optimizer, {}, None, rank0, sharding.plan(model, 1))
    found, state = sharding.read_state(tmp_path / "s", sharding.plan(model, 1))
    assert state["has_best"] is False
    assert sharding.load_state(found, state, model, optimizer, rank0, {"unused": torch.zeros(1)}) is None


def test_a_failed_save_names_the_folder_and_the_reason_and_leaves_no_step(rank0, checkpoint, tmp_path, monkeypatch):
    model = load(checkpoint)
    sharding.shard(model, rank0)
    optimizer = _trained_one_step(model)

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sharding.dcp, "save", disk_full)
    folder = tmp_path / "s"
    with pytest.raises(HeadpruneError) as failed:
        sharding.save_state(folder, 2, model, optimizer, {}, None, rank0, sharding.plan(model, 1))
    assert str(failed.value) == f"could not save the training state in {folder}: No space left on device"
    assert [p.name for p in folder.iterdir()] == [MARKER]  # no step, no temporary, no latest.json

    def broken(*args, **kwargs):
        raise RuntimeError("not an OS error")

    monkeypatch.setattr(sharding.dcp, "save", broken)
    with pytest.raises(RuntimeError, match="^not an OS error$"):  # a bug is not reported as a full disk
        sharding.save_state(folder, 2, model, optimizer, {}, None, rank0, sharding.plan(model, 1))
    assert [p.name for p in folder.iterdir()] == [MARKER]


def _saved(tmp_path, layout=None, files=None, name="step-00000004") -> tuple:
    folder = tmp_path / "state"
    (folder / name).mkdir(parents=True)
    (folder / "latest.json").write_text(json.dumps({"step": 4, "folder": name}))
    state = {"step": 4, "plan": layout or {"world": 2, "units": UNITS}}
    if files is not None:
        state["files"] = files
    (folder / name / "state.json").write_text(json.dumps(state))
    return folder, folder / name


def test_resuming_under_another_world_size_or_plan_is_refused_before_reading(tmp_path):
    folder, step = _saved(tmp_path)
    assert sharding.read_state(folder, {"world": 2, "units": UNITS}) == (
        step,
        {"step": 4, "plan": {"world": 2, "units": UNITS}},
    )
    for world, units in ((3, UNITS), (2, UNITS + 1)):
        with pytest.raises(UsageError) as refused:
            sharding.read_state(folder, {"world": world, "units": units})
        assert str(refused.value) == (
            f"--resume: the sharded state in {folder} was saved by 2 processes over {UNITS} shard units; "
            f"this run has {world} over {units} "
            "(resume with torchrun --nproc-per-node 2, or start over without --resume)"
        )


def test_a_missing_or_unreadable_state_is_refused_in_one_line(tmp_path):
    layout = {"world": 2, "units": UNITS}
    with pytest.raises(UsageError) as refused:
        sharding.read_state(tmp_path, layout)
    assert str(refused.value) == f"--resume: no training state in {tmp_path} (nothing was saved yet)"
    folder, step = _saved(tmp_path)
    unreadable = f"--resume: training state in {folder} is unreadable or not a sharded (--fsdp) state "
    for pointer, reason in (
        # the reason is quoted (repr), and what the pointer names inside it too
        (
            {"step": 4, "folder": "../elsewhere"},
            """("latest.json names '../elsewhere', not a step folder of this state")""",
        ),
        ({"step": 4, "folder": "step-4x"}, """("latest.json names 'step-4x', not a step folder of this state")"""),
        ({"step": 4, "folder": 7}, """("latest.json names '7', not a step folder of this state")"""),
        ({"step": 4, "folder": "step-x1"}, """("latest.json names 'step-x1', not a step folder of this state")"""),
        ({"step": 4}, """("'folder'")"""),
    ):
        (folder / "latest.json").write_text(json.dumps(pointer))
        with pytest.raises(UsageError) as refused:
            sharding.read_state(folder, layout)
        assert str(refused.value) == unreadable + reason
    (folder / "latest.json").write_text(json.dumps({"step": 4, "folder": step.name}))
    (step / "state.json").write_text(json.dumps({"step": 4}))  # a state saved without --fsdp has no plan
    with pytest.raises(UsageError) as refused:
        sharding.read_state(folder, layout)
    assert str(refused.value) == unreadable + """("'plan'")"""


def test_a_shard_missing_or_cut_short_is_refused_by_name(tmp_path):
    layout = {"world": 2, "units": UNITS}
    folder, step = _saved(tmp_path, files={"__0_0.distcp": 5, "rng-0.safetensors": 3})
    (step / "__0_0.distcp").write_bytes(b"12345")
    with pytest.raises(UsageError) as refused:
        sharding.read_state(folder, layout)
    assert str(refused.value) == f"--resume: shard {step / 'rng-0.safetensors'} of the training state is missing"
    (step / "rng-0.safetensors").write_bytes(b"12")
    with pytest.raises(UsageError) as refused:
        sharding.read_state(folder, layout)
    assert str(refused.value) == (
        f"--resume: shard {step / 'rng-0.safetensors'} of the training state is corrupt (2 bytes, saved as 3); "
        "start over without --resume"
    )
    (step / "rng-0.safetensors").write_bytes(b"123")
    assert sharding.read_state(folder, layout)[0] == step


def test_every_rank_refuses_with_the_refusal_of_its_own_read(tmp_path):
    with pytest.raises(UsageError) as refused:
        sharding.read_state_agreed(tmp_path, {"world": 1, "units": UNITS}, Dist())
    assert str(refused.value) == f"--resume: no training state in {tmp_path} (nothing was saved yet)"
    folder, step = _saved(tmp_path, layout={"world": 1, "units": UNITS})
    assert sharding.read_state_agreed(folder, {"world": 1, "units": UNITS}, Dist())[0] == step


def test_a_state_that_does_not_restore_names_dcps_first_failure(rank0, checkpoint, tmp_path):
    model = load(checkpoint)
    sharding.shard(model, rank0)
    optimizer = _trained_one_step(model)
    layout = sharding.plan(model, 1)
    sharding.save_state(tmp_path / "s", 1, model, optimizer, {}, None, rank0, layout)
    found, state = sharding.read_state(tmp_path / "s", layout)
    (found / "rng-0.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(UsageError) as refused:
        sharding.load_state(found, state, model, optimizer, rank0, None)
    prefix = f"--resume: training state in {found} does not restore ("
    assert str(refused.value) == prefix + "'Error while deserializing header: header too large')"  # safetensors' own
    shard = next(found.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:10])
    with pytest.raises(UsageError) as refused:
        sharding.load_state(found, state, model, optimizer, rank0, None)
    message = str(refused.value)
    assert message.startswith(prefix) and "\n" not in message
    print("MSG", message)


def test_buffers_are_the_models_own_and_copied_out_of_it(rank0, checkpoint):
    """Buffers come from the sharded model, not from the config (a RoPE table changed at run
    time keeps its values), as copies (the plain model does not share the training model's memory)."""
    model = load(checkpoint)
    sharding.shard(model, rank0)
    rope = model.model.rotary_emb
    rope.inv_freq.mul_(3.0)
    plain = sharding.gathered(model, rank0)
    torch.testing.assert_close(plain.model.rotary_emb.inv_freq, rope.inv_freq, rtol=0, atol=0)
    assert "rotary_emb.inv_freq" not in vars(plain.model)  # set on its owner module, not as a dotted attribute
    rope.inv_freq.add_(1.0)
    assert not torch.equal(plain.model.rotary_emb.inv_freq, rope.inv_freq)


def test_gathered_weights_that_do_not_fit_the_plain_model_are_refused(rank0, checkpoint, monkeypatch):
    from headprune_cli.model import checkpoint as checkpoint_module  # noqa: PLC0415 (replaced below)

    model = load(checkpoint)
    sharding.shard(model, rank0)
    real = checkpoint_module.read_layout_only

    def with_an_extra_projection(path):
        plain = real(path)
        plain.extra = torch.nn.Linear(2, 2, device="meta")
        return plain

    monkeypatch.setattr(checkpoint_module, "read_layout_only", with_an_extra_projection)
    with pytest.raises(HeadpruneError) as refused:
        sharding.gathered(model, rank0)
    assert str(refused.value) == "gathered weights do not fit the model (extra.weight)"

    def without_the_head(path):
        plain = real(path)
        del plain.lm_head
        return plain

    monkeypatch.setattr(checkpoint_module, "read_layout_only", without_the_head)
    with pytest.raises(HeadpruneError) as refused:
        sharding.gathered(model, rank0)
    assert str(refused.value) == "gathered weights do not fit the model (lm_head.weight)"


def test_a_save_replaces_a_temporary_left_by_a_crash_and_writes_no_best_it_was_not_given(rank0, checkpoint, tmp_path):
    from torch.distributed.checkpoint import FileSystemReader  # noqa: PLC0415

    model = load(checkpoint)
    sharding.shard(model, rank0)
    optimizer = _trained_one_step(model)
    sharding.save_state(tmp_path / "s", 1, model, optimizer, {}, None, rank0, sharding.plan(model, 1))
    stale = tmp_path / "s" / ".step-00000002.tmp"  # a crash mid-save of step 2
    stale.mkdir()
    (stale / "half-written").write_bytes(b"x")
    sharding.save_state(tmp_path / "s", 2, model, optimizer, {}, None, rank0, sharding.plan(model, 1))
    step = tmp_path / "s" / "step-00000002"
    assert not stale.exists() and not (step / "half-written").exists()
    keys = FileSystemReader(str(step)).read_metadata().state_dict_metadata
    assert keys and not [k for k in keys if k.startswith("best")]


def test_state_json_is_sorted_and_indented_and_a_step_saved_twice_is_replaced(rank0, checkpoint, tmp_path):
    model = load(checkpoint)
    sharding.shard(model, rank0)
    optimizer = _trained_one_step(model)
    layout = sharding.plan(model, 1)
    for _ in range(2):  # a resumed run saves the step it resumed from again
        sharding.save_state(tmp_path / "s", 3, model, optimizer, {"b": 1, "a": [2]}, None, rank0, layout)
    step = tmp_path / "s" / "step-00000003"
    files = {p.name: p.stat().st_size for p in sorted(step.iterdir()) if p.name != "state.json"}
    meta = {"a": [2], "b": 1, "files": files, "has_best": False, "plan": layout, "step": 3}
    assert (step / "state.json").read_text() == json.dumps(meta, sort_keys=True, indent=1)


def test_a_save_that_fails_before_its_temporary_exists_reports_the_first_error(
    rank0, checkpoint, tmp_path, monkeypatch
):
    model = load(checkpoint)
    sharding.shard(model, rank0)
    optimizer = _trained_one_step(model)

    def disk_full(folder):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sharding, "make_folder", disk_full)
    with pytest.raises(HeadpruneError) as failed:
        sharding.save_state(tmp_path / "s", 1, model, optimizer, {}, None, rank0, sharding.plan(model, 1))
    assert str(failed.value) == f"could not save the training state in {tmp_path / 's'}: No space left on device"


def test_a_rank_that_read_the_state_still_refuses_when_another_did_not(tmp_path):
    class OtherRankRefused(Dist):
        def sum(self, tensor):
            return tensor + 1

    folder, step = _saved(tmp_path, layout={"world": 1, "units": UNITS})
    with pytest.raises(UsageError) as refused:
        sharding.read_state_agreed(folder, {"world": 1, "units": UNITS}, OtherRankRefused())
    assert str(refused.value) == f"--resume: 1 other process(es) refused the training state in {folder}"


def test_dcps_collected_failure_is_named_by_its_first_exception_cut_to_160_characters():
    from torch.distributed.checkpoint.api import CheckpointException  # noqa: PLC0415

    failure = CheckpointException("rank 0 failed", {0: (ValueError("bad shard\nsecond line"), None)})
    assert sharding._reason(failure) == "'bad shard'"
    assert sharding._reason(CheckpointException("x", {1: OSError("plain")})) == "'plain'"
    long = sharding._reason(RuntimeError("y" * 400))
    assert len(long) == 160 and long.endswith("...")


def test_an_unreadable_state_quotes_at_most_160_characters_of_the_reason(tmp_path):
    name = "step-" + "0" * 150  # a step folder without its state.json: the reason quotes the long path
    folder, _ = _saved(tmp_path)
    (folder / name).mkdir()
    (folder / "latest.json").write_text(json.dumps({"step": 0, "folder": name}))
    with pytest.raises(UsageError) as refused:
        sharding.read_state(folder, {"world": 2, "units": UNITS})
    prefix = f"--resume: training state in {folder} is unreadable or not a sharded (--fsdp) state ("
    reason = str(refused.value).removeprefix(prefix)
    assert len(reason) == 160 + 1 and reason.endswith("...)")
