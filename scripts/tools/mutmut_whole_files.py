"""`mutmut` judging each mutant by every test of the files that reach it (mutation.sh runs this).

mutmut 3 runs, for a mutant, only the tests its stats run saw calling the mutated function,
and it charges a call to the test being set up at the time: a module-scoped fixture that
exports or trains once for a whole file is charged to the file's first test alone, so the
tests that read that fixture's result never judge the mutant (onnx_quantize, 2026-12-05:
the returned record's fields, asserted by a test of the fixture's file, "survived"; the same
mutant run by hand against the file fails that test). Here, once the stats are collected or
loaded, each function's tests become every test of the files its covering tests are in, as
the suite judges it. mutmut 3.8 reads that table directly (`tests_by_mangled_function_name`)
when it submits a mutant, so the table itself is widened, not a helper around it.

A function the stats run saw no test call is judged by every test of the module's own test
files (`pytest_add_cli_args_test_selection`), not reported "no tests": a safety net (the one
case so far, sharding's `check_fsdp`, was a test whose name mutation.sh's `-k` deselects).

    python scripts/tools/mutmut_whole_files.py run [mutmut's arguments]
"""

from __future__ import annotations

import mutmut.__main__ as mutmut_main
from mutmut.configuration import config
from mutmut.state import state
from mutmut.utils.format_utils import mangled_name_from_mutant_name

_collect_or_load_stats = mutmut_main.collect_or_load_stats
_collect_mutants = mutmut_main.collect_source_file_mutation_data


def _file_of(test: str) -> str:
    return test.removeprefix("mutants/").split("::")[0]


def _tests_by_file() -> dict[str, set[str]]:
    """Every test the stats run collected (by mutmut's names), grouped by file."""
    by_file: dict[str, set[str]] = {}
    for test in state().duration_by_test:
        by_file.setdefault(_file_of(test), set()).add(test)
    return by_file


def _widen_to_whole_files() -> None:
    """Every function's covering tests, plus every other test of their files."""
    by_file = _tests_by_file()
    table = state().tests_by_mangled_function_name
    for function, tests in table.items():
        table[function] = set(tests).union(*(by_file.get(_file_of(test), set()) for test in tests))


def _collect_then_widen(*args, **kwargs) -> None:
    _collect_or_load_stats(*args, **kwargs)
    _widen_to_whole_files()


def _selected_tests() -> set[str]:
    """Every collected test of the module's own test files."""
    by_file = _tests_by_file()
    return set().union(*(by_file.get(f, set()) for f in config().pytest_add_cli_args_test_selection))


def _mutants_then_fill(*args, **kwargs):
    mutants, by_path = _collect_mutants(*args, **kwargs)
    table = state().tests_by_mangled_function_name
    selected = _selected_tests()
    for _, name, _ in mutants:
        function = mangled_name_from_mutant_name(name.replace("__init__.", ""))
        if not table.get(function):
            table[function] = set(selected)
    return mutants, by_path


mutmut_main.collect_or_load_stats = _collect_then_widen
mutmut_main.collect_source_file_mutation_data = _mutants_then_fill

if __name__ == "__main__":
    mutmut_main.cli()
