"""Two processes writing the same new output at once: exactly one wins, the other says the
output now exists and leaves it as the winner wrote it; --force still replaces.

Each round starts two real `headprune` processes together. Plain rounds race as they come
(the loser may also see the file at its first check, `exists`). Barrier rounds make every
round a true race: a hook holds each process at its final rename until both have reached
it, so both have passed every check, and only the no-replace rename decides.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from tests.support import finished, headprune, leftovers

BARRIER = textwrap.dedent("""
    import os, sys, time
    import headprune_cli.files.temps as temps
    real = temps.rename_noreplace
    gate = {gate!r}

    def together(source, target):  # both processes are here, past every check, before either renames
        open(os.path.join(gate, str(os.getpid())), "w").close()
        deadline = time.time() + 60
        while len(os.listdir(gate)) < 2 and time.time() < deadline:
            time.sleep(0.005)
        return real(source, target)

    temps.rename_noreplace = together
    from headprune_cli.cli.app import run
    run()
""")


def barrier_script(folder: Path, name: str) -> Path:
    gate = folder / f"gate-{name}"
    gate.mkdir()
    script = folder / f"barrier-{name}.py"
    script.write_text(BARRIER.format(gate=str(gate)))
    return script


def race(folder: Path, first: list, second: list, script: Path | None = None) -> list[tuple[int, str, str]]:
    processes = [headprune(*first, cwd=folder, script=script), headprune(*second, cwd=folder, script=script)]
    return [finished(p, timeout=300) for p in processes]


def one_winner(results, barrier: bool) -> int:
    """The index of the one process that succeeded; the other refused in one line."""
    winners = [i for i, (code, _, _) in enumerate(results) if code == 0]
    assert len(winners) == 1, results
    code, out, err = results[1 - winners[0]]
    lines = [line for line in err.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    raced = code == 1 and (
        "now exists: another process wrote it" in lines[0] or "now exists: another process created it" in lines[0]
    )
    checked = code == 2 and "exists; pass --force" in lines[0]  # it came second to the first check
    assert raced or (checked and not barrier), err
    return winners[0]


@pytest.mark.parametrize("barrier", [False, True], ids=["as-they-come", "at-the-rename"])
def test_two_selects_of_one_new_plan(work, barrier):
    """20 rounds at the rename, 6 as they come (select starts without torch: about a second a round)."""
    ratios = ("0.25", "0.5")
    for round_ in range(20 if barrier else 6):
        out = work / f"plan-{round_}.json"
        script = barrier_script(work, str(round_)) if barrier else None
        results = race(work, *[["select", "scores.json", "--ratio", r, "-o", out.name] for r in ratios], script=script)
        winner = one_winner(results, barrier)
        assert json.loads(out.read_text())["config"]["ratio"] == float(ratios[winner])  # the winner's plan, whole
    assert leftovers(work) == []


def test_two_prunes_of_one_new_checkpoint(work):
    """One round: each process imports torch and transformers (seconds on 2 cores); the
    rename it races through is the one select's 20 rounds exercise."""
    for round_ in range(1):
        out = f"small-{round_}.safetensors"
        results = race(
            work,
            ["prune", "model.safetensors", "--plan", "plan.json", "-o", out],
            ["prune", "model.safetensors", "--scores", "scores.json", "--ratio", "0.5", "-o", out],
            barrier_script(work, f"p{round_}"),
        )
        winner = one_winner(results, barrier=True)
        from headprune_cli import load
        from headprune_cli.model.layout import info_of

        heads = sum(len(h) for h in info_of(load(work / out)).layout.heads)
        assert heads == (12 if winner == 0 else 8)  # plan.json removes 4 of 16 heads, --ratio 0.5 removes 8
    assert leftovers(work) == []


def test_two_exports_of_one_new_folder(work):
    """One round (two model loads): the folder built beside its target, renamed without replacing."""
    results = race(
        work, *[["export", "model.safetensors", "--hf", "exported"]] * 2, script=barrier_script(work, "export")
    )
    one_winner(results, barrier=True)
    assert (work / "exported" / "config.json").is_file() and leftovers(work) == []


@pytest.mark.parametrize("what", ["--plot folder", "out folder"])
def test_a_new_folder_another_process_creates_first_is_not_shared(work, what):
    """report --plot, sweep -o and run --out check their folder, work, then create it: a
    folder that appeared in between (made by another process, marker and all) is refused,
    and left as it is."""
    from headprune_cli.errors import HeadpruneError
    from headprune_cli.files.outputs import check_folder, make_folder, own_claims

    folder = work / "plots"
    with own_claims():
        check_folder(folder, [work / "model.safetensors"], what)
        make_folder(work / "other")  # another process wins the race to the same kind of folder...
        os.rename(work / "other", folder)  # ... and its folder appears under this one's name
        (folder / "head_map.png").write_bytes(b"the winner's plot")
        with pytest.raises(HeadpruneError, match="now exists: another process created it"):
            make_folder(folder)
    assert (folder / "head_map.png").read_bytes() == b"the winner's plot"


def test_a_file_published_between_the_checks_and_the_claim_is_not_replaced(work, monkeypatch):
    """The race CI met as they came: the other process published after this one's existence
    check but before its claim. The claim follows the check's look, so the rename still refuses."""
    from headprune_cli.errors import HeadpruneError
    from headprune_cli.files import outputs
    from headprune_cli.files.temps import publish

    out = work / "new-plan.json"
    real_check_parent = outputs.check_parent

    def winner_publishes_now(path):
        out.write_text("the winner's plan")
        real_check_parent(path)

    monkeypatch.setattr(outputs, "check_parent", winner_publishes_now)
    with outputs.own_claims():
        outputs.check_output(out)
        mine = work / "mine.json"
        mine.write_text("this process's plan")
        with pytest.raises(HeadpruneError, match="now exists: another process wrote it"):
            publish(mine, out)
    assert out.read_text() == "the winner's plan"


def test_force_still_replaces(work, cli):
    assert cli("select", work / "scores.json", "--ratio", "0.25", "-o", work / "p.json").code == 0
    result = cli("select", work / "scores.json", "--ratio", "0.5", "-o", work / "p.json", "--force")
    assert result.code == 0, result.err
    assert json.loads((work / "p.json").read_text())["config"]["ratio"] == 0.5
