"""Benchmark: `score --method taylor` vs a plain forward+backward, real MiniLM, 2 threads.

    OMP_NUM_THREADS=2 /tmp/venv0/bin/python -m scripts.benchmarks.score [--examples 64] [--batch-size 16] [--repeats 3]

Prints the ratio time(score taylor) / time(forward+backward over the same batches);
the target is <= 1.2. Both sides run the same loss (MiniLM is an embedding model, so
the fidelity objective's random-projection surrogate); the plain pass computes every
weight gradient, as training would. The batches are the first --examples lines of
examples/minilm_text.txt. scripts/benchmarks/suite.py calls score_cost().
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from headprune_cli import batches, embed, probe_loss, score_model

from .common import minilm, split_text


def plain_forward_backward(model, dataset, batch_size: int) -> None:
    """The same loss as fidelity scoring (seed 0), every weight's gradient, as training would."""
    for start, batch in enumerate(batches(dataset, batch_size)):
        model.zero_grad(set_to_none=True)
        probe_loss(embed(model, batch), batch["attention_mask"], 0, start * batch_size).sum().backward()


def timed(fn) -> float:
    begin = time.perf_counter()
    fn()
    return time.perf_counter() - begin


def score_cost(model, dataset, batch_size: int, repeats: int) -> dict:
    """Median seconds of `taylor` scoring and of a plain forward+backward, interleaved."""
    score = lambda: score_model(model, dataset, "taylor", "fidelity", batch_size=batch_size)  # noqa: E731
    plain = lambda: plain_forward_backward(model, dataset, batch_size)  # noqa: E731
    score(), plain()  # warm-up
    t_score, t_plain = [], []
    for _ in range(repeats):  # interleaved, so load on the machine hits both alike
        t_score.append(timed(score))
        t_plain.append(timed(plain))
    model.zero_grad(set_to_none=True)
    return {
        "examples": len(dataset),
        "tokens": int(dataset.input_ids.shape[1]),
        "batch": batch_size,
        "repeats": repeats,
        "score_s": statistics.median(t_score),
        "plain_s": statistics.median(t_plain),
        "ratio": statistics.median(t_score) / statistics.median(t_plain),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = minilm()
    dataset, _ = split_text(model, args.examples, 0, max_length=128)
    r = score_cost(model, dataset, args.batch_size, args.repeats)
    print(f"MiniLM-L6, {r['examples']} examples x {r['tokens']} tokens max, batch {r['batch']}, 2 threads")
    print(f"score --method taylor: {r['score_s']:.3f} s (median of {r['repeats']})")
    print(f"plain forward+backward: {r['plain_s']:.3f} s")
    print(f"ratio: {r['ratio']:.3f} (target <= 1.2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
