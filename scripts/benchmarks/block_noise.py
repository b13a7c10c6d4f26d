"""How steady is one block's time on this machine, and does the loaded (file-mapped) block
run slower than a heap copy of itself? (BENCHMARKS section 16.) Times the first block of
MODEL three ways, interleaved in alternating order for six rounds of
torch.utils.benchmark's blocked_autorange (0.3 s each), one thread, batch 8:
the loaded block, a deep copy (every tensor in fresh memory) and `profile`'s variant cut to
the full FFN width minus 8.

  OMP_NUM_THREADS=1 python -m scripts.benchmarks.block_noise MODEL SEQ_LEN
"""

import copy
import statistics
import sys

import torch
from torch.utils import benchmark

from headprune_cli.model.arch import adapter_for
from headprune_cli.model.checkpoint import load
from headprune_cli.stages.profile.measure import block_inputs, variant

ROUNDS = 6


def main() -> None:
    torch.set_num_threads(1)
    model = load(sys.argv[1]).eval()
    ids = torch.randint(5, 1000, (8, int(sys.argv[2])), generator=torch.Generator().manual_seed(0))
    args, kwargs = block_inputs(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    block = adapter_for(model).layer_list(model)[0]
    width = adapter_for(model).ffn(block).width

    def call(b):
        def run():
            with torch.inference_mode():
                b(*args, **kwargs)

        return run

    calls = {
        "loaded (file-mapped)": call(block),
        "deep copy (heap)": call(copy.deepcopy(block)),
        f"variant at width {width - 8}": call(variant(model, block, width=width - 8)),
    }
    times = {name: [] for name in calls}
    for r in range(ROUNDS):
        for name, run in list(calls.items()) if r % 2 == 0 else list(reversed(calls.items())):
            timer = benchmark.Timer("run()", globals={"run": run}, num_threads=1)
            times[name].append(timer.blocked_autorange(min_run_time=0.3).median * 1000)
    for name, values in times.items():
        print(f"{name}: median {statistics.median(values):.2f} ms (rounds: {', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
