"""What torchrun (or accelerate) told this process: its rank, the world size, the rendezvous.

The launcher passes them as environment variables. A hand-set `WORLD_SIZE=2` without the
rest, or a value that is not a number, is a bad environment: one line naming the variable,
before any model is read, instead of torch's own error from inside the process group.
No torch here: the device options read LOCAL_RANK without importing it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from headprune_cli.errors import UsageError, shorten

# What torch's env:// rendezvous reads when more than one process joins.
RENDEZVOUS = ("RANK", "MASTER_ADDR", "MASTER_PORT")
LAUNCH_HINT = "start it with torchrun --nproc-per-node N (which sets them all), or unset WORLD_SIZE for one process"


@dataclass(frozen=True)
class Launch:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1


def env_int(name: str, default: int, low: int = 0) -> int:
    """An integer environment variable (at least `low`), or `default` when it is unset."""
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise UsageError(f"{name}={shorten(text)} is not an integer; {LAUNCH_HINT}") from None
    if value < low:
        raise UsageError(f"{name}={value} is below {low}; {LAUNCH_HINT}")
    return value


def launch() -> Launch:
    """This process's place among the launched ones, checked (see the module doc)."""
    world = env_int("WORLD_SIZE", 1, low=1)
    if world == 1:
        return Launch()
    missing = [name for name in RENDEZVOUS if not os.environ.get(name, "").strip()]
    if missing:
        raise UsageError(f"WORLD_SIZE={world} but {', '.join(missing)} not set; {LAUNCH_HINT}")
    rank = env_int("RANK", 0)
    if rank >= world:
        raise UsageError(f"RANK={rank} is not below WORLD_SIZE={world}; {LAUNCH_HINT}")
    env_int("MASTER_PORT", 0, low=1)
    local_world = env_int("LOCAL_WORLD_SIZE", 1, low=1)
    local_rank = env_int("LOCAL_RANK", 0)
    if local_rank >= local_world and "LOCAL_WORLD_SIZE" in os.environ:
        raise UsageError(f"LOCAL_RANK={local_rank} is not below LOCAL_WORLD_SIZE={local_world}; {LAUNCH_HINT}")
    return Launch(rank, world, local_rank, local_world)
