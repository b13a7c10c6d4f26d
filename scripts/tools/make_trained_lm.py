"""Train a small LLaMA-shaped causal LM (grouped-query attention, SwiGLU) on real text.

No pretrained LM can be downloaded here, so this makes one: a byte-level BPE tokenizer
(the `tokenizers` package) and a LlamaForCausalLM trained from scratch on Debian's
package descriptions (see lm_corpus.py), then saved as a transformers folder
(save_pretrained + tokenizer.json) and imported as a headprune checkpoint, so every
headprune command runs on it. It lands in a cache folder keyed by a hash of the recipe
and the corpus; the same recipe, corpus, seed and thread count rebuild it byte for byte.

Recipes: `full` (10.5 M parameters), `small` (4 M; what a loaded 2-core machine trains in
~20 minutes) and `tiny` (seconds; the test).
Usage: python -m scripts.tools.make_trained_lm [--recipe full] [--apt-lists DIR | --text FILE]
       [--cache DIR] [--seed 0] [--threads 2]
Prints the summary JSON (checkpoint, split files, validation perplexity, unigram baseline).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from scripts.tools.lm_corpus import CorpusError, debian_documents, split_documents, text_file_documents

FORMAT = 1  # bump when the code changes what a recipe builds, so old caches are not reused
SPECIAL = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2


@dataclass(frozen=True)
class Recipe:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    block: int  # training sequence length (documents packed, separated by </s><s>)
    batch: int
    steps: int
    lr: float
    warmup: int
    max_train_docs: int | None = None  # cap for quick recipes
    eval_length: int = 128  # the validation perplexity truncates each document here


RECIPES = {
    # 8 layers (so one layer is 1/8 of depth), 8 query heads sharing 4 KV heads (groups
    # of 2, so KV-group pruning has 4 steps per layer), head dim 32, SwiGLU 768: 10.5 M
    # parameters. Smaller than a "real" small LM on purpose: two CPU cores shared with
    # other jobs train ~2500 tokens/s at this size (~900/s at 19 M), and 30 minutes of
    # that is ~1.5 M tokens; a bigger model would learn less in the same time.
    "full": Recipe(
        layers=8,
        hidden=256,
        heads=8,
        kv_heads=4,
        ffn=768,
        vocab=8192,
        block=256,
        batch=16,
        steps=360,
        lr=2e-3,
        warmup=30,
    ),
    # What 2 cores shared by several jobs train in ~15-25 minutes (measured: the `full`
    # recipe ran at ~30 s/step under a load average of 11): 4.0 M parameters, 8 query /
    # 4 KV heads of dim 24, 6 layers, 600 k training tokens.
    "small": Recipe(
        layers=6,
        hidden=192,
        heads=8,
        kv_heads=4,
        ffn=512,
        vocab=4096,
        block=128,
        batch=16,
        steps=300,
        lr=3e-3,
        warmup=20,
    ),
    "tiny": Recipe(
        layers=2,
        hidden=64,
        heads=4,
        kv_heads=2,
        ffn=128,
        vocab=384,
        block=64,
        batch=8,
        steps=30,
        lr=3e-3,
        warmup=5,
        max_train_docs=400,
        eval_length=64,
    ),
}


def default_cache() -> Path:
    return Path(os.environ.get("HEADPRUNE_CACHE", Path.home() / ".cache" / "headprune")) / "trained-lm"


def recipe_key(recipe: Recipe, corpus_sha: str, seed: int, threads: int) -> str:
    import tokenizers
    import torch
    import transformers

    spec = {
        "format": FORMAT,
        "recipe": dataclasses.asdict(recipe),
        "corpus": corpus_sha,
        "seed": seed,
        "threads": threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def train_tokenizer(texts: list[str], vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        special_tokens=SPECIAL,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    # Every encoded document starts with <s>, as in training, so headprune's text reader
    # (which encodes with special tokens) scores the same distribution the model learned.
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tokenizer


def token_stream(tokenizer, texts: list[str]):
    """All documents as one stream: <s> doc </s> <s> doc </s> ..."""
    import torch

    ids: list[int] = []
    for enc in tokenizer.encode_batch(texts):
        ids.extend(enc.ids)  # starts with <s>
        ids.append(2)
    return torch.tensor(ids, dtype=torch.long)


def build_model(recipe: Recipe):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=recipe.vocab,
        hidden_size=recipe.hidden,
        num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.kv_heads,
        head_dim=recipe.hidden // recipe.heads,
        intermediate_size=recipe.ffn,
        hidden_act="silu",
        max_position_embeddings=max(1024, recipe.block),
        rope_theta=10000.0,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        initializer_range=0.02,
    )
    return LlamaForCausalLM(config)


def learning_rate(recipe: Recipe, step: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    progress = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model, stream, recipe: Recipe, seed: int, log) -> list[float]:
    import torch

    blocks = stream[: len(stream) // recipe.block * recipe.block].view(-1, recipe.block)
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(blocks), generator=generator)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=recipe.lr, betas=(0.9, 0.95)
    )
    model.train()
    losses, start, cursor = [], time.perf_counter(), 0
    for step in range(recipe.steps):
        if cursor + recipe.batch > len(order):  # next epoch: a new fixed permutation
            order, cursor = torch.randperm(len(blocks), generator=generator), 0
        ids = blocks[order[cursor : cursor + recipe.batch]]
        cursor += recipe.batch
        for group in opt.param_groups:
            group["lr"] = learning_rate(recipe, step)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % 20 == 0 or step + 1 == recipe.steps:
            log(
                f"step {step + 1}/{recipe.steps} loss {sum(losses[-20:]) / len(losses[-20:]):.3f} "
                f"{time.perf_counter() - start:.0f}s"
            )
    model.eval()
    return losses


def unigram_perplexity(tokenizer, train_texts: list[str], valid_texts: list[str], length: int) -> float:
    """Perplexity of add-one-smoothed train token frequencies on the tokens the model is scored on."""
    counts = [1] * tokenizer.get_vocab_size()
    for enc in tokenizer.encode_batch(train_texts):
        for i in enc.ids[1:]:
            counts[i] += 1
    total = sum(counts)
    nll, n = 0.0, 0
    for enc in tokenizer.encode_batch(valid_texts):
        for i in enc.ids[1:length]:  # what the model predicts: every token after <s>, truncated alike
            nll -= math.log(counts[i] / total)
            n += 1
    return math.exp(nll / n)


def write_lines(path: Path, texts: list[str]) -> None:
    path.write_text("".join(t + "\n" for t in texts), encoding="utf-8")


def save_folder(model, tokenizer, folder: Path) -> None:
    model.save_pretrained(str(folder))
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "model_max_length": 1024}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")


def build(docs, recipe: Recipe, seed: int, threads: int, cache: Path, log=print) -> dict:
    """Train (or reuse) the model for this recipe; return the summary with its file paths."""
    import torch

    import headprune_cli
    from headprune_cli import evaluate, import_folder, info_of, read_data

    splits = split_documents(docs)
    if recipe.max_train_docs is not None:
        splits["train"] = splits["train"][: recipe.max_train_docs]
    corpus_sha = hashlib.sha256("\n".join(f"{k}\t{t}" for k in splits for t in splits[k]).encode()).hexdigest()
    key = recipe_key(recipe, corpus_sha, seed, threads)
    out = cache / key
    summary_path = out / "summary.json"
    if summary_path.is_file():
        log(f"cached: {out}")
        return json.loads(summary_path.read_text())
    work = cache / f"{key}.partial"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for name, texts in splits.items():
        write_lines(work / f"{name}.txt", texts)

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    tokenizer = train_tokenizer(splits["train"], recipe.vocab)
    stream = token_stream(tokenizer, splits["train"])
    log(f"corpus: {', '.join(f'{k} {len(v)} docs' for k, v in splits.items())}; {len(stream)} train tokens")
    model = build_model(recipe)
    params = sum(p.numel() for p in model.parameters())
    log(f"model: {params / 1e6:.2f} M parameters")
    start = time.perf_counter()
    losses = train(model, stream, recipe, seed, log)
    seconds = time.perf_counter() - start

    save_folder(model, tokenizer, work / "hf")
    checkpoint = work / "model.safetensors"
    imported = import_folder(work / "hf")
    # transformers records the folder it loaded from; keep the file independent of the cache path.
    imported.config._name_or_path = f"trained-lm-{key}"
    info_of(imported).config["_name_or_path"] = f"trained-lm-{key}"
    sha = headprune_cli.save(imported, checkpoint)
    loaded = headprune_cli.load(checkpoint)
    valid = read_data(work / "valid.txt", loaded, max_length=recipe.eval_length)
    ppl = next(m.value for m in evaluate(loaded, valid, "causal-lm") if m.name == "perplexity")
    summary = {
        "recipe": dataclasses.asdict(recipe),
        "seed": seed,
        "threads": threads,
        "key": key,
        "parameters": params,
        "train_tokens_seen": recipe.steps * recipe.batch * recipe.block,
        "train_tokens_available": len(stream),
        "train_seconds": round(seconds, 1),
        "first_train_loss": round(sum(losses[:5]) / len(losses[:5]), 4),
        "final_train_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
        "valid_perplexity": round(ppl, 3),
        "unigram_perplexity": round(
            unigram_perplexity(tokenizer, splits["train"], splits["valid"], recipe.eval_length), 3
        ),
        "docs": {k: len(v) for k, v in splits.items()},
        "corpus_sha256": corpus_sha,
        "checkpoint_sha256": sha,
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    if out.exists():
        shutil.rmtree(out)
    work.rename(out)
    return summary | {"folder": str(out)}


def with_paths(summary: dict, folder: Path) -> dict:
    names = {
        "checkpoint": "model.safetensors",
        "hf_folder": "hf",
        "train": "train.txt",
        "calib": "calib.txt",
        "valid": "valid.txt",
    }
    return summary | {k: str(folder / v) for k, v in names.items()} | {"folder": str(folder)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="full")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--apt-lists", type=Path, help="apt lists folder holding Translation-en (default: apt's own)")
    source.add_argument("--text", type=Path, help="a plain text corpus instead, one document a line")
    parser.add_argument("--cache", type=Path, default=default_cache())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        docs = text_file_documents(args.text) if args.text else debian_documents(args.apt_lists)
    except CorpusError as exc:
        sys.exit(f"Error: {exc}")
    summary = build(docs, RECIPES[args.recipe], args.seed, args.threads, args.cache, log)
    print(json.dumps(with_paths(summary, args.cache / summary["key"]), indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
