"""What a command's answer must look like: the in-process result, the refusal contract, a folder snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from headprune_cli.errors import EXIT_ERROR, EXIT_GATE_FAILED, EXIT_INTERNAL, EXIT_USAGE


@dataclass
class CliResult:
    code: int
    out: str
    err: str


def assert_refused(result: CliResult, code: int, message: str) -> None:
    """`result` is the refusal of bad input with exit `code` and `message` in its one line.

    A refusal is exit 1, 2 or 3 with exactly one `Error: ...` line on stderr, no traceback
    and nothing on stdout. An internal error (a crash: exit 70, `Internal error: ...`)
    never passes, whatever its message says, so a mutation that removes a validation and
    lets the command crash further on is caught.
    """
    assert code in (EXIT_ERROR, EXIT_USAGE, EXIT_GATE_FAILED), f"{code} is not a refusal code"
    assert result.code != EXIT_INTERNAL and not result.err.startswith("Internal error"), (
        f"crashed instead of refusing: {result}"
    )
    assert result.code == code, result
    assert result.err.startswith("Error: ") and result.err.count("\n") == 1 and result.err.endswith("\n"), result.err
    assert message.lower() in result.err.lower(), (message, result.err)
    assert "Traceback" not in result.err and result.out == "", result


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under a folder with its bytes: to show a failed command changed nothing."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
