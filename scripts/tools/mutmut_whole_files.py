"""`mutmut` judging each mutant by every test of the files that reach it (mutation.sh runs this).

mutmut 3 runs, for a mutant, only the tests its stats run saw calling the mutated function,
and it charges a call to the test being set up at the time: a module-scoped fixture that
exports or trains once for a whole file is charged to the file's first test alone, so the
tests that read that fixture's result never judge the mutant (onnx_quantize, 2026-12-05:
per-channel weights, asserted by a test of the fixture's file, "survived"). Here a mutant is
judged by every test of each file one of its covering tests is in, as the suite judges it.

    python scripts/tools/mutmut_whole_files.py run [mutmut's arguments]
"""

from __future__ import annotations

import mutmut.__main__ as mutmut_main
from mutmut.state import state

_covering = mutmut_main.tests_for_mutant_names


def _whole_files(mutant_names) -> set[str]:
    tests = set(_covering(mutant_names))
    files = {test.split("::")[0] for test in tests}
    # duration_by_test holds every test the stats run collected, under the names mutmut runs them by
    return tests | {test for test in state().duration_by_test if test.removeprefix("mutants/").split("::")[0] in files}


mutmut_main.tests_for_mutant_names = _whole_files

if __name__ == "__main__":
    mutmut_main.cli()
