"""Where `score`'s memory goes: peak RSS per phase of one scoring run, in one process.

A thread samples the resident set (/proc/self/statm) every 5 ms and keeps the largest
value seen in each phase: load, data, forward (every batch's forward pass), backward
(torch.autograd.grad of the gradient methods, with the neuron taps' hooks under --ffn),
artifact (the scores JSON built) and write. /usr/bin/time's peak is the largest of them.

    OMP_NUM_THREADS=2 nice -n 10 python -m scripts.benchmarks.score_memory /tmp/ffn_bench/model.safetensors \
        --data /tmp/ffn_bench/ids.safetensors --objective causal-lm --method fisher --batch-size 2 --ffn -o /tmp/s.json
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--data", required=True)
    parser.add_argument("--objective")
    parser.add_argument("--method", default="fisher")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--ffn", action="store_true")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    phase, peaks = ["start"], {}

    def watch() -> None:
        while True:
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * PAGE_KB
            peaks[phase[0]] = max(peaks.get(phase[0], 0), rss)
            time.sleep(0.005)

    threading.Thread(target=watch, daemon=True).start()
    import torch

    from headprune_cli import load
    from headprune_cli.artifacts.schema import write_artifact
    from headprune_cli.data.readers import read_data
    from headprune_cli.stages.score.importance import gradients, score_model, scores_artifact

    grad = torch.autograd.grad

    def timed_grad(*a, **k):  # the backward, told apart from the forward around it
        phase[0] = "backward"
        try:
            return grad(*a, **k)
        finally:
            phase[0] = "forward"

    gradients.torch.autograd.grad = timed_grad
    phase[0] = "load"
    model = load(args.checkpoint)
    phase[0] = "data"
    dataset = read_data(args.data, model, max_length=args.max_length)
    phase[0] = "forward"
    result = score_model(
        model, dataset, args.method, args.objective, batch_size=args.batch_size, ffn=args.ffn, normalize=not args.ffn
    )
    phase[0] = "artifact"
    artifact = scores_artifact(
        model, result, model_path=args.checkpoint, data_path=args.data, max_length=args.max_length
    )
    phase[0] = "write"
    write_artifact(artifact, args.output)
    phase[0] = "end"
    time.sleep(0.05)
    size_kb = os.path.getsize(args.checkpoint) / 1024
    print(
        json.dumps(
            {name: {"peak_rss_kb": kb, "of_checkpoint": round(kb / size_kb, 3)} for name, kb in peaks.items()}, indent=1
        )
    )


if __name__ == "__main__":
    main()
