"""One error family, mapped to exit codes in exactly one place (`describe`, used by the CLI and the pipeline).

Library code raises these; the CLI turns them into a single `Error: ...` line on
stderr. Anything else escaping is a bug: one `Internal error: ...` line and exit
EXIT_INTERNAL, so a crash can never pass for a refusal (in tests or in a CI job), with
the traceback shown only when HEADPRUNE_DEBUG=1.
"""

import os
import sys
import traceback

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_GATE_FAILED = 3
EXIT_INTERNAL = 70  # EX_SOFTWARE from sysexits.h: a bug in headprune, not bad input
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C; SIGTERM exits the same way


class HeadpruneError(Exception):
    """Base of every error headprune reports to a user."""

    exit_code = EXIT_ERROR


class UsageError(HeadpruneError):
    """The command line or a config asks for something impossible."""

    exit_code = EXIT_USAGE


class CheckpointError(HeadpruneError):
    """A checkpoint is missing, corrupt, or not a headprune file."""


class ArtifactError(HeadpruneError):
    """A JSON artifact (scores, plan, report) is malformed or of the wrong kind."""


class DataError(HeadpruneError):
    """Input data cannot be read or does not fit the model/task."""


class ArchitectureError(HeadpruneError):
    """A model family is unknown, or an operation breaks its structural rules."""


class PlanError(HeadpruneError):
    """A pruning plan cannot be applied to this model."""


class NumericalError(HeadpruneError):
    """A NaN/inf appeared where a finite number is required."""


class PeerFault(HeadpruneError):
    """A torchrun peer process died or the process group broke (runtime/faults.py names it).

    torchrun stops the surviving ranks with SIGTERM right after; that stop must not replace
    this line when it lands while the error is already on its way out (main() reports it)."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived. A BaseException, so that `except Exception` cannot swallow
    it while every `finally` and `except BaseException` on the way out removes temporaries."""


MAX_LINE = 500  # an error line's length at most: values in it are cut to 80 (shorten), this is the net


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when empty), for one-line errors."""
    lines = str(exc).strip().splitlines()
    return one_line(lines[0]) if lines else type(exc).__name__


def one_line(text: str) -> str:
    """`text` as one line of at most MAX_LINE characters: a message that quotes a value its
    writer forgot to shorten still never floods the terminal or a CI log."""
    text = " ".join(str(text).split("\n"))
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 3] + "..."


def shorten(value, limit: int = 80) -> str:
    """repr() of a value cut to `limit` characters: an error quotes what it refuses,
    never megabytes of it (a YAML alias bomb, a 50 MB line)."""
    try:
        text = repr(value) if not isinstance(value, str) or limit < 0 else repr(value[: limit + 1])
    except ValueError:  # int too large to print (Python's digit limit)
        return f"<int of {value.bit_length()} bits>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(exc: BaseException) -> tuple[int, str]:
    """(exit code, the one stderr line) for an exception that ends a command or a stage.

    Refusals and the environment's failures (disk full, permissions) are `Error: ...`; any
    other exception is a bug: `Internal error: ...` with its own exit code."""
    if isinstance(exc, HeadpruneError):
        return exc.exit_code, f"Error: {first_line(exc)}"
    if isinstance(exc, BrokenPipeError):  # the reader went away: nothing left to tell
        return EXIT_ERROR, ""
    if isinstance(exc, MemoryError):
        return EXIT_ERROR, "Error: out of memory"
    if isinstance(exc, OSError):
        return EXIT_ERROR, f"Error: {one_line(os_error_line(exc))}"
    detail = one_line((str(exc).strip().splitlines() or [""])[0])
    message = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    return EXIT_INTERNAL, f"Internal error: {message} (please report; HEADPRUNE_DEBUG=1 for the traceback)"


def report(exc: BaseException) -> int:
    """Print the exception's one line on stderr (and its traceback when HEADPRUNE_DEBUG=1); its exit code."""

    code, line = describe(exc)
    if os.environ.get("HEADPRUNE_DEBUG", "") not in ("", "0"):
        traceback.print_exception(exc)
    if line:
        print(line, file=sys.stderr)
    return code


def os_error_line(exc: OSError) -> str:
    """'PATH: Permission denied' rather than Python's "[Errno 13] Permission denied: 'PATH'"."""
    if exc.strerror and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    return exc.strerror or first_line(exc)
