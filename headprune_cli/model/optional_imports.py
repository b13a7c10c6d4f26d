"""Optional imports of transformers' that no headprune command uses, kept out of the CLI process.

transformers' model code imports scipy.optimize whenever scipy is installed (the Hungarian
matcher of its object-detection losses, imported with every model's base class): 37 MiB
resident in each process that builds a model, 7% of SmolLM2-135M's float32 checkpoint and
the difference between scoring it within 2x its size and not (BENCHMARKS.md, "How much
memory"). The CLI tells transformers that scipy is not there before its model code is first
imported; a library caller's process is left as it is (its own code may want those losses).
"""

from __future__ import annotations

import sys

_state = {"cli": False}


def in_cli() -> None:
    """Called once by the CLI's main: this process runs one headprune command."""
    _state["cli"] = True


def leave_out_scipy() -> None:
    """In the CLI, before transformers' model code is imported: its scipy import skipped."""
    if not _state["cli"] or "transformers.modeling_utils" in sys.modules or "scipy" in sys.modules:
        return  # too late (the losses imported it already) or scipy in use anyway
    import transformers.utils as hf_utils  # noqa: PLC0415 (only where a model is about to be built)
    from transformers.utils import import_utils  # noqa: PLC0415 (the same)

    def unavailable() -> bool:
        return False

    hf_utils.is_scipy_available = import_utils.is_scipy_available = unavailable
