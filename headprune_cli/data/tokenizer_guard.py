"""A tokenizer shipped inside the user's checkpoint, failing on the user's text, is bad input.

The Rust tokenizers library panics when its regex engine (Oniguruma) gives up on a pattern
that backtracks without bound (`Onig: retry-limit-in-match`): Python sees a
PanicException, and Rust's panic hook has already written the panic and a backtrace to
file descriptor 2, around Python's sys.stderr. Here every call into the tokenizer runs
with descriptor 2 captured: on success what it printed is passed on unchanged; on failure
it is dropped and the error becomes one `Error:` line naming the data file, the row and
the tokenizer's reason.

When the checkpoint's tokenizer is first built, its normalizer, pre-tokenizer and model
also run on a few short probes (49 characters: a run of one letter, digit, space or
punctuation mark, then a different character), so that a pattern that gives up on
ordinary text is refused before any data is read, naming the checkpoint.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

from headprune_cli.errors import DataError, first_line

T = TypeVar("T")
PROBES = tuple(
    run * 48 + end
    for run, end in (("a", "!"), ("a", "b"), (" ", "a"), ("1", "a"), (".", "a"), ("'", "a"), ("é", "a"), ("\n", "a"))
)
_REGEX_FAILURE = ("onig", "regex", "retry-limit")


class TokenizerFailure(Exception):
    """The tokenizer failed (raised, or panicked in Rust) on some input; `reason` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@contextmanager
def native_stderr_captured() -> Iterator[None]:
    """Descriptor 2 goes to a temporary file while the block runs; passed on afterwards
    unless the block failed (a Rust panic's text is then dropped: the error says it)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no descriptor 2 (embedded): nothing to capture
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if not failed:
                sink.seek(0)
                _pass_on(sink.read())


def _pass_on(data: bytes) -> None:
    if data:
        os.write(2, data)


def guarded(call: Callable[[], T]) -> T:
    """`call()`, with a tokenizer's exception or Rust panic turned into TokenizerFailure."""
    try:
        with native_stderr_captured():
            return call()
    except BaseException as exc:  # pyo3's PanicException derives from BaseException
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise  # an interrupt or exit: not the tokenizer's doing
        raise TokenizerFailure(first_line(exc)) from None


def encode_rows(
    encode: Callable[[list, list | None], T], texts: list[str], pairs: list | None, wheres: Sequence[str]
) -> T:
    """encode(texts, pairs) for all rows at once; when it fails, find the first row that
    fails alone and refuse it in one line."""
    try:
        return guarded(lambda: encode(texts, pairs))
    except TokenizerFailure as whole:
        for i, where in enumerate(wheres):
            try:
                # the lambda runs within this iteration, so late binding of `i` is harmless
                guarded(lambda: encode(texts[i : i + 1], pairs[i : i + 1] if pairs is not None else None))  # noqa: B023
            except TokenizerFailure as alone:
                raise DataError(
                    f"{where}: the checkpoint's tokenizer failed on this row ({_cut(alone.reason)})"
                ) from None
        raise DataError(
            f"{wheres[0].rsplit(':', 1)[0]}: the checkpoint's tokenizer failed ({_cut(whole.reason)})"
        ) from None


def probe(backend, checkpoint: str) -> None:
    """Refuse a tokenizer whose regex engine gives up on the short, ordinary probes."""
    for text in PROBES:
        try:
            guarded(lambda: backend.encode(text))  # noqa: B023 - called within this iteration
        except TokenizerFailure as failure:
            if any(word in failure.reason.lower() for word in _REGEX_FAILURE):
                raise DataError(
                    f"{checkpoint}: its tokenizer gives up on a 49-character text ({text[:1]!r} x48 + {text[-1]!r}): "
                    f"{_cut(failure.reason)}; a pattern in tokenizer.json backtracks without bound"
                ) from None
            # Any other failure (a missing unknown token, say) is left to the rows that meet it.


def _cut(reason: str, limit: int = 160) -> str:
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."
