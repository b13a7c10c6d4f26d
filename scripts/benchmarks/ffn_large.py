"""FFN neurons at LLM scale: a streamed prune of 25% of every layer's FFN neurons (the
same count in every layer) plus two of the four KV groups per layer, on a 1.1 B-parameter bf16 LLaMA
(scripts/bench_large.py's shape: 22 layers, hidden 2048, 16 query / 4 KV heads of 128,
FFN 5632; random weights), and the plain transformers export of the result.

Steps, each its own process so that each peak RSS is its own (run under /usr/bin/time -v):
  make      build the random bf16 model from its config and save it as a headprune checkpoint
  prune     streamed prune (no model built) with the plan above -> pruned.safetensors
  export    streamed export --hf of the pruned checkpoint -> a plain transformers folder
  logits    headprune_cli.load(folder) and the plain folder's logits, to compare
  plain     transformers from_pretrained of the folder in a process where headprune
            cannot be imported; writes its logits

Usage (from the repository root, PYTHONPATH=$PWD):
  nice -n 10 /usr/bin/time -v python scripts/benchmarks/ffn_large.py make --work /tmp/ffn_bench
  nice -n 10 /usr/bin/time -v python scripts/benchmarks/ffn_large.py prune --work /tmp/ffn_bench
  ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SHAPE = dict(
    vocab_size=32000,
    hidden_size=2048,
    num_hidden_layers=22,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=128,
    intermediate_size=5632,
    max_position_embeddings=2048,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
FFN_SHARE = 0.25


def make(work: Path) -> None:
    import torch
    import transformers as T

    from headprune_cli import save

    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = T.LlamaForCausalLM(T.LlamaConfig(**SHAPE))
    model.eval()
    save(model, work / "model.safetensors", overwrite=True)


def data(work: Path) -> None:
    """The calibration set `score` reads in the memory runs: 4 rows x 64 token ids, seeded."""
    import torch
    from safetensors.torch import save_file

    ids = torch.randint(3, SHAPE["vocab_size"], (4, 64), generator=torch.Generator().manual_seed(2))
    save_file({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, str(work / "ids.safetensors"))


def plan() -> tuple[dict, dict]:
    """Two KV groups (their query heads too) and 25% of the FFN neurons of every layer, chosen
    at random per layer (seeded): uneven indices, one width and one head count for all."""
    import torch

    layers, heads, kv = SHAPE["num_hidden_layers"], SHAPE["num_attention_heads"], SHAPE["num_key_value_heads"]
    group = heads // kv
    generator = torch.Generator().manual_seed(0)
    width = SHAPE["intermediate_size"]
    cut = int(width * FFN_SHARE)
    # two of the four KV groups, different ones per layer: 8 query heads (LlamaConfig needs
    # hidden_size % heads == 0, so 12 heads at hidden 2048 has no plain config)
    remove_heads = {
        layer: [h for g in (layer % kv, (layer + 1) % kv) for h in range(g * group, (g + 1) * group)]
        for layer in range(layers)
    }
    remove_ffn = {layer: sorted(torch.randperm(width, generator=generator)[:cut].tolist()) for layer in range(layers)}
    return remove_heads, remove_ffn


def prune(work: Path) -> None:
    from headprune_cli import prune_file

    remove_heads, remove_ffn = plan()
    out = work / "pruned.safetensors"
    out.unlink(missing_ok=True)
    prune_file(work / "model.safetensors", out, remove_heads, [], remove_ffn=remove_ffn)
    size, pruned = (work / "model.safetensors").stat().st_size, out.stat().st_size
    print(json.dumps({"checkpoint_bytes": size, "pruned_bytes": pruned}))


def export(work: Path) -> None:
    import shutil

    from headprune_cli import run_stage

    shutil.rmtree(work / "hf", ignore_errors=True)
    run_stage("export", checkpoint=work / "pruned.safetensors", hf=work / "hf", with_onnx=False)
    print(json.dumps({"config": json.loads((work / "hf" / "config.json").read_text())}))


def ids():
    import torch

    return torch.randint(3, SHAPE["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1))


def logits(work: Path) -> None:
    import torch
    from safetensors.torch import save_file

    import headprune_cli

    model = headprune_cli.load(work / "hf").float()
    with torch.no_grad():
        save_file({"logits": model(ids()).logits.contiguous()}, str(work / "headprune_logits.safetensors"))


PLAIN = """
import sys
class _NoHeadprune:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "headprune_cli":
            raise ImportError("headprune_cli is not importable in this process")
sys.meta_path.insert(0, _NoHeadprune())
import torch, transformers
from safetensors.torch import load_file, save_file
work = sys.argv[1]
model = transformers.AutoModelForCausalLM.from_pretrained(work + "/hf", dtype=torch.float32)
model.eval()
ids = torch.randint(3, %d, (2, 16), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    got = model(ids).logits
want = load_file(work + "/headprune_logits.safetensors")["logits"]
print("max |transformers - headprune| =", float((got - want).abs().max()),
      "intermediate_size =", model.config.intermediate_size,
      "heads =", model.config.num_attention_heads, "kv heads =", model.config.num_key_value_heads)
assert not [m for m in sys.modules if m.startswith("headprune_cli")]
"""


def plain(work: Path) -> None:
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    subprocess.run([sys.executable, "-I", "-c", PLAIN % SHAPE["vocab_size"], str(work)], check=True, env=env)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("step", choices=["make", "data", "prune", "export", "logits", "plain"])
    parser.add_argument("--work", type=Path, default=Path("out/ffn_bench"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    globals()[args.step](args.work)


if __name__ == "__main__":
    main()
