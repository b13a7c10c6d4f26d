"""Sorted index sets as [start, stop) runs, and the bounds on FFN widths: what layouts and
neuron scores store. No torch here, so JSON readers (`select`) use it without loading it."""

from __future__ import annotations

MAX_FFN_WIDTH = 1 << 19  # as config_check bounds intermediate sizes: a header cannot claim more
MAX_FFN_NEURONS = 1 << 23  # in all layers together; the largest public model (LLaMA-405B) has 6.7 million


def to_ranges(indices: list[int]) -> list[list[int]]:
    """Sorted distinct indices as half-open [start, stop) runs: what a layout stores, so
    that a 28,672-neuron layer cut in a few blocks costs a few numbers, not 28,672."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return runs


def from_ranges(runs, bound: int) -> list[int] | None:
    """The indices of canonical [start, stop) runs (increasing, apart, within 0..bound),
    as to_ranges writes them; None if malformed."""
    if not isinstance(runs, list):
        return None
    out: list[int] = []
    last = -1
    for run in runs:
        if not (isinstance(run, list) and len(run) == 2 and all(_is_int(v) for v in run)):
            return None
        start, stop = run
        if not last < start < stop <= bound:
            return None
        out.extend(range(start, stop))
        last = stop
    return out


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
