"""peer_faults in one process: a dead peer named from a communication error or from
torchrun's SIGTERM, and that SIGTERM landing while the named error is already on its way out.

The peers are this process (rank 0) and a reaped child (rank 1, the dead one); the CLI's
main() runs a stand-in for the typer app, so the line and the exit code are the user's."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import time

import pytest
import torch.distributed as dist

from headprune_cli.errors import EXIT_INTERRUPTED
from headprune_cli.runtime import faults

app = importlib.import_module("headprune_cli.cli.app")  # the module (the package exports its Typer as `app`)


@pytest.fixture
def dead_peer(monkeypatch) -> int:
    """Rank 1's pid: a process that has exited and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    here = faults._machine()
    monkeypatch.setattr(faults, "_PEERS", [(here, os.getpid()), (here, child.pid)])
    monkeypatch.setattr(faults, "_RANK", 0)
    return child.pid


def _main_running(command, monkeypatch) -> int:
    """main() with `command` as the whole app (its signals, its error lines, its exit code)."""
    monkeypatch.setattr(app, "app", lambda **_: command())
    return app.main([])


def _signal_self(signum: int = signal.SIGTERM) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.5)  # the handler runs at the next bytecode; never reached when it raises


def _gloo_error_then(signum: int):
    """A rank's command that fails on gloo's error and gets `signum` while the error unwinds."""

    def command():
        try:
            with faults.peer_faults(None):
                raise dist.DistError("[gloo] Connection closed by peer")
        finally:
            _signal_self(signum)

    return command


def test_a_communication_error_names_the_dead_rank(dead_peer: int, monkeypatch, capsys):
    def command():
        with faults.peer_faults(None):
            raise dist.DistError("[gloo] Connection closed by peer")

    assert _main_running(command, monkeypatch) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"Error: rank 1 (pid {dead_peer}) died while rank 0 trained"), err
    assert err.endswith("no training state was saved yet: rerun the same torchrun command to start over"), err


def test_torchruns_sigterm_after_a_dead_peer_names_it(dead_peer: int, monkeypatch, capsys):
    def command():
        with faults.peer_faults(None):
            _signal_self()

    assert _main_running(command, monkeypatch) == 1
    assert capsys.readouterr().err.startswith(f"Error: rank 1 (pid {dead_peer}) died while rank 0 trained")


def test_torchruns_sigterm_during_the_cleanup_after_a_named_fault_keeps_the_line(dead_peer: int, monkeypatch, capsys):
    # The flaky CI case: rank 0 named the dead rank from gloo's error, and torchrun's SIGTERM
    # came while that error unwound through a cleanup; it printed "Error: interrupted".
    assert _main_running(_gloo_error_then(signal.SIGTERM), monkeypatch) == 1
    assert capsys.readouterr().err.startswith(f"Error: rank 1 (pid {dead_peer}) died while rank 0 trained")


def test_the_watchers_copy_of_torchruns_sigterm_is_the_same_stop(dead_peer: int, monkeypatch, capsys):
    # torchrun stops a worker with killpg: the rank gets SIGTERM, and its watcher passes on a
    # second one, which (a flaky CI case) landed while the rank looked for its dead peer and
    # turned the named fault into "Error: interrupted".
    look = faults.dead_peers

    def looking_when_the_copy_lands(wait_s: float = 0.0) -> list[int]:
        _signal_self()
        return look(wait_s)

    monkeypatch.setattr(faults, "dead_peers", looking_when_the_copy_lands)

    def command():
        with faults.peer_faults(None):
            _signal_self()

    assert _main_running(command, monkeypatch) == 1
    assert capsys.readouterr().err.startswith(f"Error: rank 1 (pid {dead_peer}) died while rank 0 trained")


def test_a_ctrl_c_is_the_users_stop_even_with_a_dead_peer(dead_peer: int, monkeypatch, capsys):
    assert _main_running(_gloo_error_then(signal.SIGINT), monkeypatch) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip() == "Error: interrupted"


def test_a_sigterm_with_every_peer_alive_is_a_stop(monkeypatch, capsys):
    here = faults._machine()
    monkeypatch.setattr(faults, "_PEERS", [(here, os.getpid()), (here, os.getppid())])

    def command():
        with faults.peer_faults(None):
            _signal_self()

    assert _main_running(command, monkeypatch) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip() == "Error: interrupted"
