"""The tokenizer of a checkpoint as GGUF metadata, so that llama.cpp tokenizes as transformers does.

llama.cpp reimplements tokenizers rather than running tokenizer.json, so only the kinds it has
can be carried: byte-level BPE (GPT-2, Llama 3, Qwen2 and every tokenizer trained with
`tokenizers`' ByteLevel pre-tokenizer) becomes `tokenizer.ggml.model = "gpt2"` with its vocab,
merges and the pre-tokenizer regex llama.cpp names (`tokenizer.ggml.pre`). The pre-tokenizer is
recognised by its structure and regex, not by the hash of a sample encoding that llama.cpp's
converter uses, because that hash also covers the vocabulary: a tokenizer trained here never
matches it. Anything else (WordLevel, WordPiece, SentencePiece-style BPE with byte fallback) is
refused: a GGUF that tokenizes differently would serve a different model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from headprune_cli.errors import ArchitectureError

# Split regexes of the byte-level tokenizers llama.cpp knows, as their tokenizer.json spells
# them (llama.cpp's src/llama-vocab.cpp quotes these as the originals of its adapted patterns).
_SPLIT_PRE = {
    (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    ): "llama-bpe",
    (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    ): "qwen2",
}
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5  # gguf.TokenType, without importing gguf here


@dataclass
class GgufVocab:
    pre: str  # tokenizer.ggml.pre
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    special: dict[str, int]  # bos / eos / unk / pad -> token id
    add_bos: bool
    add_eos: bool


def gguf_vocab(tokenizer_json: str | None, tokenizer_config: dict, vocab_size: int) -> GgufVocab:
    """The GGUF vocab of a tokenizer.json, padded to the model's `vocab_size` rows."""
    if tokenizer_json is None:
        raise ArchitectureError("the checkpoint carries no tokenizer; llama.cpp needs one inside the GGUF file")
    tok = json.loads(tokenizer_json)
    model = tok.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        kind = model.get("type", "unknown") + (" with byte fallback" if model.get("byte_fallback") else "")
        raise ArchitectureError(
            f"llama.cpp cannot reproduce this {kind} tokenizer; --gguf supports byte-level BPE tokenizers "
            "(GPT-2, Llama 3, Qwen2 style)"
        )
    pre = _pre_tokenizer(tok.get("pre_tokenizer"), tok.get("normalizer"))
    tokens, types = _tokens(model["vocab"], tok.get("added_tokens") or [], vocab_size)
    index = {t: i for i, t in enumerate(tokens)}
    add_bos, add_eos = _template_specials(tok.get("post_processor"))
    return GgufVocab(
        pre=pre,
        tokens=tokens,
        token_types=types,
        merges=[m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []],
        special=_special_ids(tokenizer_config, index),
        add_bos=add_bos,
        add_eos=add_eos,
    )


def _pre_tokenizer(pre: dict | None, normalizer: dict | None) -> str:
    """llama.cpp's name for the pre-tokenizer, or a refusal that says what it is."""
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre] if pre else []
    kinds = [s.get("type") for s in steps]
    if normalizer not in (None, {"type": "NFC"}):  # llama.cpp normalises nothing else for these
        raise ArchitectureError(f"llama.cpp cannot reproduce this tokenizer's {normalizer.get('type')} normalizer")
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        regex = (steps[0].get("pattern") or {}).get("Regex")
        if regex in _SPLIT_PRE:
            return _SPLIT_PRE[regex]
    raise ArchitectureError(
        f"llama.cpp has no pre-tokenizer known to equal this tokenizer's ({' + '.join(map(str, kinds)) or 'none'}); "
        "--gguf supports the GPT-2, Llama 3 and Qwen2 byte-level pre-tokenizers"
    )


def _tokens(vocab: dict[str, int], added: list[dict], size: int) -> tuple[list[str], list[int]]:
    by_id: dict[int, tuple[str, int]] = {i: (t, NORMAL) for t, i in vocab.items()}
    for entry in added:
        by_id[entry["id"]] = (entry["content"], CONTROL if entry.get("special") else USER_DEFINED)
    if by_id and max(by_id) >= size:
        raise ArchitectureError(f"the tokenizer has token id {max(by_id)} but the model has only {size} embeddings")
    # Rows the tokenizer never produces still need a name; llama.cpp's converter pads the same way.
    rows = [by_id.get(i, (f"[PAD{i}]", UNUSED)) for i in range(size)]
    return [t for t, _ in rows], [k for _, k in rows]


def _template_specials(post: dict | None) -> tuple[bool, bool]:
    """Whether the post-processor adds a special token before / after a single sequence."""
    single = post.get("single", []) if post and post.get("type") == "TemplateProcessing" else []
    if post and post.get("type") == "Sequence":
        for step in post.get("processors", []):
            if step.get("type") == "TemplateProcessing":
                single = step.get("single", [])
    first, last = (single[0], single[-1]) if single else ({}, {})
    return "SpecialToken" in first, "SpecialToken" in last and len(single) > 1


def _special_ids(config: dict, index: dict[str, int]) -> dict[str, int]:
    found = {}
    for kind in ("bos", "eos", "unk", "pad"):
        value = config.get(f"{kind}_token")
        if isinstance(value, dict):  # an AddedToken written out as a dict
            value = value.get("content")
        if isinstance(value, str) and value in index:
            found[kind] = index[value]
    return found
