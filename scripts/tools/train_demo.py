"""Train the bundled example: a small reference encoder on a task that needs attention.

Task ("after-X"): a sequence of 16 letters a-l holds two markers, X and Y, once each.
Four classes: whether X comes before Y (`xy-` or `yx-`), crossed with whether the letter
right after X is low (a-f) or high (g-l). Token counts cannot tell the classes apart (the
same letters and markers occur in every class), so the model has to find the markers,
compare their positions, and read the token one step after X: heads specialise
(marker-finding, previous-token, position comparison), and which heads a pruner
removes matters.

Deterministic: fixed seeds, deterministic torch algorithms, 1 thread. Writes
examples/demo/{model.safetensors, train.jsonl, dev.jsonl, calib.jsonl, calib.txt}.

Usage: python scripts/tools/train_demo.py [--out examples/demo] [--steps 1500]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

import headprune_cli
from headprune_cli import info_of
from headprune_cli.model.arch import ReferenceConfig, ReferenceEncoder

LETTERS = [chr(c) for c in range(ord("a"), ord("a") + 12)]
MARKERS = ["X", "Y"]
LOW, HIGH = LETTERS[:6], LETTERS[6:]
LABELS = ["xy-low", "xy-high", "yx-low", "yx-high"]
SPECIAL = ["[PAD]", "[UNK]"]
SEQ_LEN = 16


def make_row(rng: random.Random) -> dict:
    """One example, classes balanced: the label is chosen first, the sequence built to fit."""
    label = rng.randrange(len(LABELS))
    x_first, high = divmod(label, 2)
    x_first = x_first == 0
    words = [rng.choice(LETTERS) for _ in range(SEQ_LEN)]
    while True:
        p, q = rng.sample(range(SEQ_LEN - 1), 2)  # X never last: it must have a successor
        if abs(p - q) >= 2 and (p < q) == x_first:
            break
    words[p], words[q] = "X", "Y"
    words[p + 1] = rng.choice(HIGH if high else LOW)
    return {"text": " ".join(words), "label": label}


def make_rows(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    return [make_row(rng) for _ in range(count)]


def make_tokenizer() -> Tokenizer:
    vocab = {word: i for i, word in enumerate(SPECIAL + LETTERS + MARKERS)}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return tokenizer


def encode(tokenizer: Tokenizer, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([tokenizer.encode(r["text"]).ids for r in rows])
    return ids, torch.tensor([r["label"] for r in rows])


def build_model(vocab_size: int) -> ReferenceEncoder:
    config = ReferenceConfig(
        vocab_size=vocab_size,
        max_position=64,
        hidden_size=64,
        heads_per_layer=[4, 4, 4, 4],
        head_dim=16,
        intermediate_size=128,
        num_labels=len(LABELS),
        id2label={str(i): name for i, name in enumerate(LABELS)},
        pad_token_id=0,
    )
    model = ReferenceEncoder(config)
    # Sinusoidal start for the learned positions: "one step back/ahead" is then a linear
    # map that attention finds in a few hundred steps instead of thousands.
    with torch.no_grad():
        pos = torch.arange(config.max_position)[:, None].float()
        freq = torch.exp(-torch.arange(0, config.hidden_size, 2).float() * math.log(100.0) / config.hidden_size)
        model.position_embedding.weight[:, 0::2] = torch.sin(pos * freq)
        model.position_embedding.weight[:, 1::2] = torch.cos(pos * freq)
    return model


def accuracy(model, ids: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        pred = model(input_ids=ids).logits.argmax(-1)
    model.train()
    return (pred == labels).float().mean().item()


def train(model, tokenizer, steps: int, batch: int, seed: int, dev) -> None:
    # Fresh examples every step (an endless stream from one seed): no overfitting, and
    # the shipped train.jsonl stays small because it is only used for recovery finetuning.
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps, pct_start=0.1)
    model.train()
    start = time.perf_counter()
    for step in range(1, steps + 1):
        ids, labels = encode(tokenizer, [make_row(rng) for _ in range(batch)])
        loss = F.cross_entropy(model(input_ids=ids).logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 250 == 0 or step == steps:
            acc = accuracy(model, *dev)
            print(
                f"step {step:5d}  loss {loss.item():.4f}  dev acc {acc:.4f}  {time.perf_counter() - start:.0f}s",
                flush=True,
            )
    model.eval()


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "examples" / "demo")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # tiny matrices: a second thread only adds sync cost
    torch.use_deterministic_algorithms(True)
    args.out.mkdir(parents=True, exist_ok=True)

    tokenizer = make_tokenizer()
    # Disjoint seeds per split; the training stream uses its own seed too.
    splits = {
        "train": make_rows(args.seed + 1, 2000),
        "dev": make_rows(args.seed + 2, 500),
        "calib": make_rows(args.seed + 3, 128),
    }
    dev = encode(tokenizer, splits["dev"])

    model = build_model(tokenizer.get_vocab_size())
    train(model, tokenizer, args.steps, args.batch, args.seed + 100, dev)

    info = info_of(model)
    info.tokenizer = tokenizer.to_str()
    info.tokenizer_config = {"pad_token": "[PAD]", "unk_token": "[UNK]"}
    sha = headprune_cli.save(model, args.out / "model.safetensors", overwrite=True)  # rebuilds the bundled example
    for name, rows in splits.items():
        write_jsonl(args.out / f"{name}.jsonl", rows)
    # Label-free text for the fidelity objective and for causal-LM style readers.
    (args.out / "calib.txt").write_text("".join(r["text"] + "\n" for r in splits["calib"]))
    print(f"dev accuracy {accuracy(model, *dev):.4f}; wrote {args.out}/model.safetensors (sha256 {sha[:12]})")


if __name__ == "__main__":
    main()
