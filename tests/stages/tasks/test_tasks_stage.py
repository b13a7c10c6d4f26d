"""`headprune tasks` end to end on tiny models that share a base."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from headprune_cli import load
from headprune_cli.artifacts.neuron_scores import decode, encode
from headprune_cli.artifacts.schema import read_artifact
from headprune_cli.files.io import sha256_file
from headprune_cli.model.checkpoint import read_info
from headprune_cli.stages.tasks.plans import SHARED_RULE
from tests.stages.tasks.conftest import task_args
from tests.support import assert_refused, snapshot

BUDGET = ["--target-flops", "0.6", "--ffn-multiple-of", "1"]


def kept_heads(plan: dict, num_heads: list[int]) -> set[tuple[int, int]]:
    removed = {int(k): set(v) for k, v in plan["remove_heads"].items()}
    return {
        (layer, h)
        for layer, n in enumerate(num_heads)
        if layer not in plan["remove_layers"]
        for h in range(n)
        if h not in removed.get(layer, set())
    }


def flops_share(plan: dict) -> float:
    return plan["predicted"]["after"]["flops_per_token"] / plan["predicted"]["before"]["flops_per_token"]


def test_per_task_and_shared_plans_meet_the_budget_and_the_view_matches_them(shared_base: Path, cli):
    out = shared_base / "out"
    result = cli("tasks", *task_args(shared_base), *BUDGET, "-o", out)
    assert result.code == 0, result
    art = json.loads((out / "tasks.json").read_text())
    assert art["kind"] == "tasks" and art["base"]["how"] in ("base", "itself")
    names = [t["name"] for t in art["tasks"]]
    assert names == ["a", "b", "fid"]
    assert [t["objective"] for t in art["tasks"]] == ["classification", "classification", "fidelity"]
    shared_removed = None
    own = {}
    for name in names:
        plan = json.loads((out / f"plan-{name}.json").read_text())
        shared = json.loads((out / f"plan-shared-{name}.json").read_text())
        assert flops_share(plan) <= 0.6 + 1e-12 and flops_share(shared) <= 0.6 + 1e-12
        removed = (shared["remove_heads"], shared.get("remove_ffn"), shared["remove_layers"])
        assert shared_removed in (None, removed)  # one backbone: the same units for every task
        shared_removed = removed
        own[name] = kept_heads(plan, plan["num_heads"])
        entry = next(t for t in art["tasks"] if t["name"] == name)
        assert entry["own"]["heads_kept"] == len(own[name])
        assert entry["own"]["flops_kept"] == pytest.approx(flops_share(plan))
        assert entry["shared"]["flops_kept"] == pytest.approx(flops_share(shared))
        assert {m.role for m in read_artifact(out / f"plan-shared-{name}.json", ("plan",))[0].inputs} >= {"model"}
    every = set.intersection(*own.values())
    assert art["heads"]["every"] == [f"{layer}:{h}" for layer, h in sorted(every)]
    for name in names:
        others = set().union(*(own[n] for n in names if n != name))
        assert art["heads"]["only"][name] == [f"{layer}:{h}" for layer, h in sorted(own[name] - others)]
    ab = next(p for p in art["pairs"] if (p["a"], p["b"]) == ("a", "b"))
    assert ab["jaccard_heads"] == pytest.approx(len(own["a"] & own["b"]) / len(own["a"] | own["b"]))
    assert -1.0 <= ab["spearman_heads"] <= 1.0
    assert (out / "tasks.md").read_text().startswith("# Tasks from one base")
    assert (out / "tasks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_shared_plan_prunes_each_task_model(shared_base: Path, cli):
    out = shared_base / "out"
    assert cli("tasks", *task_args(shared_base, fidelity=False), *BUDGET, "-o", out).code == 0
    result = cli("prune", "--plan", out / "plan-shared-a.json", "-o", shared_base / "a-small.safetensors")
    assert result.code == 0, result
    info = read_info(shared_base / "a-small.safetensors")
    assert info.provenance["base"] == read_info(shared_base / "a.safetensors").provenance["base"]  # carried down


def _parameters(path: Path) -> int:
    """Parameters counted from the model's own modules (tied weights once), not from a cost table."""
    return sum(p.numel() for p in load(path).parameters())


def test_the_shared_plan_predicts_each_task_models_cut_and_names_its_rule(shared_base: Path, cli):
    out = shared_base / "out"
    assert cli("tasks", *task_args(shared_base, fidelity=False), *BUDGET, "-o", out).code == 0
    for name in ("a", "b"):
        plan = json.loads((out / f"plan-shared-{name}.json").read_text())
        own = json.loads((out / f"plan-{name}.json").read_text())
        small = shared_base / f"{name}-shared.safetensors"
        assert cli("prune", "--plan", out / f"plan-shared-{name}.json", "-o", small).code == 0
        assert plan["predicted"]["before"]["params"] == _parameters(shared_base / f"{name}.safetensors")
        assert plan["predicted"]["after"]["params"] == _parameters(small)
        assert plan["predicted"]["after"]["params"] < plan["predicted"]["before"]["params"]
        assert plan["strategy"] == "shared-" + own["strategy"]
        assert plan["config"]["strategy"] == "shared-" + own["strategy"]
        assert plan["config"]["shared"] == SHARED_RULE
        assert plan["config"]["tasks"] == ["a", "b"]
        inputs = {m["role"]: Path(m["path"]).name for m in plan["inputs"]}
        assert inputs == {"scores": f"scores-{name}.json", "model": f"{name}.safetensors"}
        own_inputs = {m["role"]: m["path"] for m in own["inputs"]}  # the task's own plan names its scores file too
        model = str(shared_base / f"{name}.safetensors")
        assert own_inputs == {"scores": str(out / f"scores-{name}.json"), "model": model}


def test_tasks_take_scores_artifacts(shared_base: Path, cli):
    data = shared_base / "data.safetensors"
    scores = []
    for name in ("a", "b"):
        path = shared_base / f"s-{name}.json"
        args = ("score", shared_base / f"{name}.safetensors", "--data", data, "--method", "fisher", "--ffn", "-o", path)
        assert cli(*args).code == 0
        scores += ["--task", f"name={name},model={shared_base / f'{name}.safetensors'},scores={path}"]
    out = shared_base / "out"
    assert cli("tasks", *scores, *BUDGET, "-o", out).code == 0
    assert not (out / "scores-a.json").exists()  # read, not scored again
    art = json.loads((out / "tasks.json").read_text())
    assert {r["role"] for r in art["inputs"]} == {"model:a", "scores:a", "model:b", "scores:b"}


def test_tasks_of_different_bases_are_refused_and_nothing_is_written(shared_base: Path, cli):
    before = snapshot(shared_base)
    args = task_args(shared_base, names=("a", "other"), fidelity=False)
    result = cli("tasks", *args, *BUDGET, "-o", shared_base / "out")
    assert_refused(result, 1, "do not share a base")
    assert snapshot(shared_base) == before and not (shared_base / "out").exists()


def test_same_inputs_give_byte_identical_files(shared_base: Path, cli, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    out = shared_base / "out"
    assert cli("tasks", *task_args(shared_base), *BUDGET, "-o", out).code == 0
    first = snapshot(out)
    assert cli("tasks", *task_args(shared_base), *BUDGET, "-o", out, "--force").code == 0
    assert snapshot(out) == first and len(first) >= 9


@pytest.mark.parametrize(
    "args,message",
    [
        (["--task", "name=a,model=x.safetensors,data=d.jsonl", "--target-flops", "0.6"], "at least two --task"),
        (["--task", "name=a,model=x", "--task", "name=b,model=y,data=d", "--target-flops", "0.6"], "needs data="),
        (["--task", "name=a,modl=x,data=d", "--task", "name=b,model=y,data=d", "--target-flops", "0.6"], "unknown key"),
        (["--task", "name=a,model=x,data=d", "--task", "name=a,model=y,data=d", "--target-flops", "0.6"], "twice"),
        (["--task", "name=a/b,model=x,data=d", "--task", "name=b,model=y,data=d", "--target-flops", "0.6"], "a name"),
        (["--task", "name=a,model=x,data=d", "--task", "name=b,model=y,data=d"], "give the one budget"),
    ],
)
def test_bad_task_options_are_usage_errors(args, message, tmp_path: Path, cli):
    assert_refused(cli("tasks", *args, "-o", tmp_path / "out"), 2, message)
    assert not (tmp_path / "out").exists()


def test_a_task_without_model_is_the_base_and_base_mismatch_is_refused(shared_base: Path, cli):
    data = shared_base / "data.safetensors"
    tasks = ["--task", f"name=a,model={shared_base / 'a.safetensors'},data={data}"]
    tasks += ["--task", f"name=fid,data={data},objective=fidelity"]
    out = shared_base / "out"
    assert cli("tasks", *tasks, "--base", shared_base / "base.safetensors", *BUDGET, "-o", out).code == 0
    art = json.loads((out / "tasks.json").read_text())
    assert art["tasks"][1]["model"] == str(shared_base / "base.safetensors")
    before = snapshot(shared_base)
    result = cli("tasks", *tasks, "--base", shared_base / "other.safetensors", *BUDGET, "-o", shared_base / "o2")
    assert_refused(result, 1, "does not come from the base")
    assert snapshot(shared_base) == before


def test_run_config_drives_the_tasks_stage_from_its_model(shared_base: Path, cli, monkeypatch):
    monkeypatch.chdir(shared_base)
    config = {
        "model": "base.safetensors",
        "out": "run",
        "stages": [
            {
                "command": "tasks",
                "task": [
                    "name=a,model=a.safetensors,data=data.safetensors",
                    "name=b,model=b.safetensors,data=data.safetensors",
                    "name=fid,data=data.safetensors,objective=fidelity",
                ],
                "target_flops": 0.6,
                "ffn_multiple_of": 1,
            }
        ],
    }
    (shared_base / "tasks.yaml").write_text(json.dumps(config))  # JSON is YAML
    result = cli("run", "tasks.yaml")
    assert result.code == 0, result
    art = json.loads((shared_base / "run" / "tasks" / "tasks.json").read_text())
    assert [t["name"] for t in art["tasks"]] == ["a", "b", "fid"] and art["budget"]["value"] == 0.6


def _scores_by_unit(scores: dict) -> dict[tuple[str, int, int], float]:
    """Every scored unit of a scores artifact: ("heads" | "ffn", layer, index) -> score."""
    out = {("heads", int(layer), int(head)): s for layer, heads in scores["heads"].items() for head, s in heads.items()}
    for layer, entry in scores["ffn"]["layers"].items():
        kept = [n for start, stop in entry["kept"] for n in range(start, stop)]
        for neuron, s in zip(kept, decode(entry["scores"], len(kept)), strict=True):
            out[("ffn", int(layer), neuron)] = s
    return out


def _kept_units(plan: dict, units) -> set:
    heads = {int(k): set(v) for k, v in plan["remove_heads"].items()}
    ffn = {int(k): set(v) for k, v in (plan.get("remove_ffn") or {}).items()}
    removed = {"heads": heads, "ffn": ffn}
    return {u for u in units if u[1] not in plan["remove_layers"] and u[2] not in removed[u[0]].get(u[1], set())}


def test_shared_plan_is_select_on_the_summed_normalised_scores(shared_base: Path, cli):
    """Reference built here from the tasks' own scores files: each task's scores divided by their
    total, summed (the mean picks the same units), selected by `headprune select` under the same
    budget. importance_kept and Spearman are recomputed from the same files."""
    data, raw, args = shared_base / "data.safetensors", {}, []
    for name in ("a", "b"):
        path = shared_base / f"s-{name}.json"
        model = shared_base / f"{name}.safetensors"
        assert cli("score", model, "--data", data, "--method", "fisher", "--ffn", "-o", path).code == 0
        raw[name] = json.loads(path.read_text())
        args += ["--task", f"name={name},model={model},scores={path}"]
    out = shared_base / "out"
    assert cli("tasks", *args, *BUDGET, "-o", out).code == 0
    units = {n: _scores_by_unit(raw[n]) for n in raw}
    norm = {n: {u: s / sum(abs(v) for v in units[n].values()) for u, s in units[n].items()} for n in raw}
    summed = {u: norm["a"][u] + norm["b"][u] for u in norm["a"]}
    reference = json.loads(json.dumps(raw["a"]))  # a's cost table: both tasks share one architecture
    reference["heads"] = {
        layer: {head: summed[("heads", int(layer), int(head))] for head in heads}
        for layer, heads in raw["a"]["heads"].items()
    }
    for layer, entry in reference["ffn"]["layers"].items():
        kept = [n for start, stop in entry["kept"] for n in range(start, stop)]
        entry["scores"] = encode([summed[("ffn", int(layer), n)] for n in kept])
    (shared_base / "summed.json").write_text(json.dumps(reference))
    assert cli("select", shared_base / "summed.json", *BUDGET, "-o", shared_base / "ref.json").code == 0
    expected = json.loads((shared_base / "ref.json").read_text())
    art = json.loads((out / "tasks.json").read_text())
    differs = False
    for name in raw:
        shared = json.loads((out / f"plan-shared-{name}.json").read_text())
        own = json.loads((out / f"plan-{name}.json").read_text())
        for key in ("remove_heads", "remove_ffn", "remove_layers"):
            assert shared[key] == expected[key], key
        entry = next(t for t in art["tasks"] if t["name"] == name)
        kept_shared, kept_own = _kept_units(shared, norm[name]), _kept_units(own, norm[name])
        differs |= kept_shared != kept_own
        assert entry["shared"]["importance_kept"] == pytest.approx(sum(norm[name][u] for u in kept_shared), rel=1e-6)
        assert entry["own"]["importance_kept"] == pytest.approx(sum(norm[name][u] for u in kept_own), rel=1e-6)
    assert differs  # otherwise the shared and own kept sets could be confused unseen
    heads = sorted(u for u in units["a"] if u[0] == "heads")
    a, b = (np.array([units[n][u] for u in heads]) for n in ("a", "b"))
    assert len(set(a)) == len(a) and len(set(b)) == len(b)  # no ties: ranks are argsort's
    rho = np.corrcoef(a.argsort().argsort(), b.argsort().argsort())[0, 1]
    assert art["pairs"][0]["spearman_heads"] == pytest.approx(rho, abs=1e-12)


def _score_files(shared_base: Path, cli, *extra: str) -> tuple[dict[str, dict], list[str]]:
    """Each task's scores file (fisher), parsed, and the --task options that name them."""
    data, raw, args = shared_base / "data.safetensors", {}, []
    for name in ("a", "b"):
        path, model = shared_base / f"s-{name}.json", shared_base / f"{name}.safetensors"
        assert cli("score", model, "--data", data, "--method", "fisher", *extra, "-o", path).code == 0
        raw[name] = json.loads(path.read_text())
        args += ["--task", f"name={name},model={model},scores={path}"]
    return raw, args


def _write_summed_scores(raw: dict[str, dict], path: Path) -> None:
    """The reference the shared plan is checked against, computed here: task a's scores file
    with each head's score replaced by the sum over tasks of its score over its task's total."""
    units = {n: {(int(l), int(h)): s for l, hs in raw[n]["heads"].items() for h, s in hs.items()} for n in raw}
    norm = {n: {u: s / sum(abs(v) for v in units[n].values()) for u, s in units[n].items()} for n in raw}
    reference = json.loads(json.dumps(raw["a"]))
    reference["heads"] = {
        layer: {head: sum(norm[n][(int(layer), int(head))] for n in raw) for head in heads}
        for layer, heads in raw["a"]["heads"].items()
    }
    path.write_text(json.dumps(reference))


def test_scores_without_a_cost_table_share_the_plan_select_makes_from_the_summed_scores(shared_base: Path, cli):
    """Scores files whose cost table is empty (an earlier version's): no prediction to price,
    so each task's shared plan is the shared selection as it is, equal to `headprune select`
    on the summed normalised head scores under the same --ratio."""
    raw, args = _score_files(shared_base, cli)
    for name, scores in raw.items():
        scores["cost"] = {}
        (shared_base / f"s-{name}.json").write_text(json.dumps(scores))
    out = shared_base / "out"
    result = cli("tasks", *args, "--ratio", "0.5", "-o", out)
    assert result.code == 0, result
    _write_summed_scores(raw, shared_base / "summed.json")
    assert cli("select", shared_base / "summed.json", "--ratio", "0.5", "-o", shared_base / "ref.json").code == 0
    expected = json.loads((shared_base / "ref.json").read_text())
    assert expected["remove_heads"] and expected["predicted"] == {}  # heads removed, nothing to price
    total = sum(len(v) for v in raw["a"]["heads"].values())
    assert sum(len(v) for v in expected["remove_heads"].values()) == total // 2
    for name in raw:
        shared = json.loads((out / f"plan-shared-{name}.json").read_text())
        for key in ("strategy", "remove_heads", "remove_layers", "remove_ffn", "predicted"):
            assert shared.get(key) == expected.get(key), key
        assert shared["config"]["strategy"] == "shared-" + expected["strategy"]
    for entry in json.loads((out / "tasks.json").read_text())["tasks"]:
        assert entry["own"]["flops_kept"] is None and entry["shared"]["flops_kept"] is None  # no cost to share


def test_the_shared_plan_uses_the_strategy_asked_for(shared_base: Path, cli):
    """--strategy layer (each layer's own share) chooses the shared plan, as `headprune select
    --strategy layer` does on the summed normalised head scores; the default (global) would not."""
    raw, args = _score_files(shared_base, cli)
    out = shared_base / "out"
    assert cli("tasks", *args, "--ratio", "0.5", "--strategy", "layer", "-o", out).code == 0
    _write_summed_scores(raw, shared_base / "summed.json")
    plans = {}
    for strategy in ("layer", "global"):
        ref = shared_base / f"ref-{strategy}.json"
        assert cli("select", shared_base / "summed.json", "--ratio", "0.5", "--strategy", strategy, "-o", ref).code == 0
        plans[strategy] = json.loads(ref.read_text())
    assert plans["layer"]["remove_heads"] != plans["global"]["remove_heads"]  # the strategy matters here
    for name in raw:
        shared = json.loads((out / f"plan-shared-{name}.json").read_text())
        assert (shared["strategy"], shared["remove_heads"]) == ("shared-layer", plans["layer"]["remove_heads"])


def test_the_shared_plan_drops_no_layer_even_from_scores_that_rank_layers(shared_base: Path, cli):
    """The shared table leaves the tasks' layer scores out (they are on each task's own loss
    scale), so the shared selection never removes a layer: a fixed --drop-layers is refused
    and a cost budget removes heads and neurons only."""
    _, args = _score_files(shared_base, cli, "--ffn", "--layers")
    result = cli("tasks", *args, *BUDGET, "--drop-layers", "1", "-o", shared_base / "o1")
    assert_refused(result, 2, "layer removal needs layer scores")
    out = shared_base / "out"
    assert cli("tasks", *args, *BUDGET, "-o", out).code == 0
    for name in ("a", "b"):
        shared = json.loads((out / f"plan-shared-{name}.json").read_text())
        assert shared["remove_layers"] == [] and shared["remove_heads"]


def _per_layer(units: set, kind: str, layers: list[int]) -> dict[str, list[int]]:
    return {str(layer): sorted(u[2] for u in units if u[0] == kind and u[1] == layer) for layer in layers}


def _view(units: set, layers: list[int]) -> dict:
    """What the tasks artifact says one kept set holds, counted here from the units."""
    return {
        "heads": _per_layer(units, "heads", layers),
        "heads_kept": sum(u[0] == "heads" for u in units),
        "ffn_kept": sum(u[0] == "ffn" for u in units),
        "ffn_per_layer": {k: len(v) for k, v in _per_layer(units, "ffn", layers).items()},
    }


def _jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def test_the_tasks_artifact_states_what_each_plan_keeps(shared_base: Path, cli):
    """Every view in tasks.json recounted from the plan files and the scores files: per task its
    own plan (which drops layers here: layer scores let it) and the shared one, what every task
    or only one keeps, heads and FFN neurons, the shared plan's view, the budget, the base and
    the files."""
    raw, args = _score_files(shared_base, cli, "--ffn", "--layers")
    out = shared_base / "out"
    assert cli("tasks", *args, *BUDGET, "-o", out).code == 0
    art = json.loads((out / "tasks.json").read_text())
    layers = list(range(len(raw["a"]["num_heads"])))
    own, shared = {}, {}
    for name in ("a", "b"):
        units = set(_scores_by_unit(raw[name]))
        own[name] = _kept_units(json.loads((out / f"plan-{name}.json").read_text()), units)
        shared[name] = _kept_units(json.loads((out / f"plan-shared-{name}.json").read_text()), units)
        entry = next(t for t in art["tasks"] if t["name"] == name)
        assert (entry["objective"], entry["method"], entry["samples"]) == (
            "classification",
            "fisher",
            raw[name]["samples"],
        )
        assert {k: entry["own"][k] for k in _view(own[name], layers)} == _view(own[name], layers)
        heads = {u for u in own[name] if u[0] == "heads"}, {u for u in shared[name] if u[0] == "heads"}
        ffn = {u for u in own[name] if u[0] == "ffn"}, {u for u in shared[name] if u[0] == "ffn"}
        assert entry["shared"]["jaccard_heads_with_own"] == pytest.approx(_jaccard(*heads), abs=1e-12)
        assert entry["shared"]["jaccard_ffn_with_own"] == pytest.approx(_jaccard(*ffn), abs=1e-12)
    assert json.loads((out / "plan-a.json").read_text())["remove_layers"]  # dropped layers are in the views
    assert shared["a"] == shared["b"] and shared["a"] != own["a"]
    plan = json.loads((out / "plan-shared-a.json").read_text())
    view = {"rule": SHARED_RULE, "strategy": plan["strategy"], **_view(shared["a"], layers)}
    assert art["shared"] == view
    for kind, spell in (("heads", lambda us: [f"{u[1]}:{u[2]}" for u in sorted(us)]), ("ffn", None)):
        mine = {n: {u for u in own[n] if u[0] == kind} for n in own}
        every, only = mine["a"] & mine["b"], {"a": mine["a"] - mine["b"], "b": mine["b"] - mine["a"]}
        write = spell or (lambda us: _per_layer(us, "ffn", layers))
        expected = {"every": write(every), "every_count": len(every)}
        expected |= {
            "only": {n: write(us) for n, us in only.items()},
            "only_count": {n: len(us) for n, us in only.items()},
        }
        assert art[kind] == expected, kind
    assert art["budget"] == {"kind": "flops", "value": 0.6, "option": "--target-flops"}
    assert art["base"] == {"sha256": sha256_file(shared_base / "base.safetensors"), "how": "base"}
    files = {"artifact": "tasks.json", "markdown": "tasks.md", "png": "tasks.png"}
    files |= {
        f"{kind}:{n}": f"{stem}{n}.json"
        for n in ("a", "b")
        for kind, stem in (("plan", "plan-"), ("shared-plan", "plan-shared-"))
    }
    assert art["files"] == files and all((out / f).is_file() for f in files.values())


def test_a_block_params_budget_is_met_on_the_blocks_by_every_plan(shared_base: Path, cli):
    out = shared_base / "out"
    result = cli("tasks", *task_args(shared_base), "--target-block-params", "0.8", "--ffn-multiple-of", "1", "-o", out)
    assert result.code == 0, result
    art = json.loads((out / "tasks.json").read_text())
    assert art["budget"] == {"kind": "block_params", "value": 0.8, "option": "--target-block-params"}
    assert art["config"]["target_block_params"] == 0.8
    base = load(shared_base / "base.safetensors")
    outside = sum(p.numel() for p in base.parameters()) - sum(p.numel() for p in base.bert.encoder.layer.parameters())
    for name in ("a", "b", "fid"):
        for plan_file in (f"plan-{name}.json", f"plan-shared-{name}.json"):
            predicted = json.loads((out / plan_file).read_text())["predicted"]
            before, after = predicted["before"]["params"] - outside, predicted["after"]["params"] - outside
            assert 0.7 < after / before <= 0.8 + 1e-12, (plan_file, after / before)
