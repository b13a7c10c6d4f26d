"""One error family, mapped to exit codes in exactly one place (cli.main).

Library code raises these; the CLI turns them into a single `Error: ...` line on
stderr. Anything else escaping is a bug and is reported the same way (exit 1), with
the traceback shown only when HEADPRUNE_DEBUG=1.
"""

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_GATE_FAILED = 3
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


class GateFailed(HeadpruneError):
    """A report gate failed: the model got worse than the budget allows."""

    exit_code = EXIT_GATE_FAILED


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived. A BaseException, so that `except Exception` cannot swallow
    it while every `finally` and `except BaseException` on the way out removes temporaries."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when empty), for one-line errors."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
