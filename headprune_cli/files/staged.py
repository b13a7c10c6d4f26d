"""Folder outputs published together with a command's main output, or not at all.

A command that writes a folder beside its main file (`finetune --keep-adapter`) or a folder
of many files (`tasks -o`) must not leave that folder behind when it fails later: a full
disk under the main output, a plot that cannot be written. So such a folder is built
complete under a locked temporary name beside its target (temps.py: a killed run's
temporary is swept by the next command), and renamed onto the target only when everything
the command writes has been written:

    with published_together():          # the command's run
        stage_folder(target, write)     # built now, renamed when the block ends cleanly
        save(main_output)               # a failure here removes the built folder

Outside a `published_together` block a staged folder is published at once.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from headprune_cli.errors import HeadpruneError
from headprune_cli.files.outputs import MARKER, MARKER_TEXT
from headprune_cli.files.temps import make_temp_folder, publish_folder

_PENDING: ContextVar[list[StagedFolder] | None] = ContextVar("headprune_staged_folders", default=None)


class StagedFolder:
    """A folder built under a locked temporary name beside `target`, then published or discarded."""

    def __init__(self, target: str | os.PathLike):
        self.target = Path(target)
        self.path, self._lock = make_temp_folder(self.target)
        (self.path / MARKER).write_text(MARKER_TEXT)

    def publish(self) -> None:
        try:
            publish_folder(self.path, self.target)
        except OSError as exc:
            self.discard()
            raise HeadpruneError(f"could not write {self.target}: {exc.strerror or exc}") from None
        except BaseException:
            self.discard()
            raise
        self._close()

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self._close()

    def _close(self) -> None:
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1


def stage_folder(target: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Build `target`'s content with `write(folder)`; publish it now, or with the enclosing
    `published_together` block. A failed `write` leaves nothing."""
    staged = StagedFolder(target)
    try:
        write(staged.path)
    except OSError as exc:
        staged.discard()
        raise HeadpruneError(f"could not write {target}: {exc.strerror or exc}") from None
    except HeadpruneError as exc:  # name the file where the user will look for it, not its temporary
        staged.discard()
        raise type(exc)(str(exc).replace(str(staged.path), str(target))) from None
    except BaseException:
        staged.discard()
        raise
    pending = _PENDING.get()
    if pending is None:
        staged.publish()
    else:
        pending.append(staged)


@contextmanager
def published_together() -> Iterator[None]:
    """Publish the folders staged inside the block when it ends cleanly; discard them when it fails."""
    pending: list[StagedFolder] = []
    token = _PENDING.set(pending)
    try:
        yield
    except BaseException:
        for staged in pending:
            staged.discard()
        raise
    finally:
        _PENDING.reset(token)
    for index, staged in enumerate(pending):
        try:
            staged.publish()
        except BaseException:
            for rest in pending[index + 1 :]:
                rest.discard()
            raise
