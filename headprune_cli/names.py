"""Helpful answers to unknown names, as lm-evaluation-harness registries give them."""

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """A suffix for an error message: ' (did you mean X?; available: a, b, c)'."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f" ({hint}available: {', '.join(known)})"
