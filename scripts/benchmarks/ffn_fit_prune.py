"""`headprune prune` with lstsq's FFN fit set (BENCHMARKS section 14): `full` refits every kept
down-projection column (what the CLI does), `diag` one scale per kept neuron (Kwon et al.'s
mask tuning), a library option the CLI does not expose.

  python -m scripts.benchmarks.ffn_fit_prune diag --plan plan.json --compensate lstsq --data calib.jsonl \\
      -o out.safetensors
"""

import functools
import sys

from headprune_cli.stages.prune import compensation


def main() -> None:
    fit = sys.argv.pop(1)
    if fit not in compensation.FFN_FITS:
        raise SystemExit(f"Error: the FFN fit is one of {', '.join(compensation.FFN_FITS)} (got {fit!r})")
    # prune imports `compensate` from the module when it runs, so it takes this one.
    compensation.compensate = functools.partial(compensation.compensate, ffn_fit=fit)
    from headprune_cli.cli.app import run

    sys.argv = ["headprune", "prune", *sys.argv[1:]]
    run()  # the watched child is forked from this process, so it keeps the fit


if __name__ == "__main__":
    main()
