"""Measured forward latency of several models, side by side.

Timing on a shared machine drifts (frequency scaling, other processes), so the models
are measured interleaved: every repeat runs each model once, alternating the order
(A B, B A, ...) so that neither model always runs first or always runs hot. Each model
gets warm-up runs first (allocator, oneDNN kernel selection). The summary is the median
with the quartiles and min/max; the speedup is the ratio of the medians.

The summary (Latency) and the alternating order are the timing harness's
(stages/timing.py, shared with `profile`); what differs is the unit timed: one whole forward or
generation per sample here, where `profile` times blocks with torch.utils.benchmark.

A run may time several phases at once: a causal LM's generation is timed as its prefill
(the prompt, with the KV cache on) and its decode steps (one token each, reading and
growing that cache), each summarised on its own.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from functools import partial

import torch
from torch import nn

from headprune_cli.errors import UsageError
from headprune_cli.model.arch import adapter_for
from headprune_cli.model.layout import info_of
from headprune_cli.runtime.device import input_device
from headprune_cli.stages.timing import Latency, alternating, summarize


def max_sequence(model: nn.Module) -> int | None:
    return adapter_for(model).max_positions(model)


def synthetic_inputs(model: nn.Module, batch: int, seq_len: int, seed: int = 0) -> tuple[dict, int]:
    """Random inputs of the stated shape (timing does not depend on token values).

    Returns the inputs and the sequence length actually used: a ViT's length is fixed
    by its image size (patches + [CLS]), whatever was asked.
    """
    adapter = adapter_for(model)
    limit = adapter.max_positions(model)  # None for ViT: its length comes from the image size
    if limit is not None and seq_len > limit:
        raise UsageError(f"--seq-len {seq_len} exceeds the model's maximum of {limit} positions")
    inputs: dict = adapter.example_inputs(model, batch, seq_len, seed=seed, first_token=3)  # + use_cache below
    seq_len = adapter.sequence_length(model, seq_len)
    if info_of(model).task == "causal-lm":
        inputs["use_cache"] = False  # a KV cache is not part of a single forward's cost
    return inputs, seq_len


def finished(model: nn.Module) -> None:
    """Wait for the model's queued GPU work: CUDA kernels run asynchronously, so a clock read
    without this would time their launch, not their run. No-op on the CPU."""
    device = input_device(model)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_once(model: nn.Module, inputs: dict, clock: Callable[[], float]) -> dict[str, float]:
    finished(model)
    start = clock()
    model(**inputs)
    finished(model)
    return {"forward": (clock() - start) * 1000.0}


def measure(
    models: Mapping[str, nn.Module],
    inputs: Mapping[str, dict],
    repeats: int = 10,
    warmup: int = 2,
    threads: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Latency]:
    """Median-and-spread latency (ms per forward) of each model, measured interleaved.

    `clock` (seconds) is there so tests can check the arithmetic with a fake one."""
    runs = {name: partial(_time_once, models[name], inputs[name], clock) for name in models}
    return {name: phases["forward"] for name, phases in measure_runs(runs, repeats, warmup, threads).items()}


def measure_runs(
    runs: Mapping[str, Callable[[], Mapping[str, float]]],
    repeats: int = 10,
    warmup: int = 2,
    threads: int | None = None,
) -> dict[str, dict[str, Latency]]:
    """Interleaved runs that each return {phase: milliseconds}; the summary per run and phase."""
    names = list(runs)
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            for name in names:
                for _ in range(warmup):
                    runs[name]()
            for order in alternating(names, repeats):
                for name in order:
                    for phase, ms in runs[name]().items():
                        samples[name].setdefault(phase, []).append(ms)
    finally:
        torch.set_num_threads(previous)
    return {name: {phase: summarize(values) for phase, values in samples[name].items()} for name in names}


# --- generation: prefill, then decode steps with the KV cache ---------------------------
def prompt_ids(model: nn.Module, batch: int, prompt: int, seed: int = 0) -> torch.Tensor:
    """Random prompt tokens, [batch, prompt] (timing does not depend on token values)."""
    vocab = int(info_of(model).config.get("vocab_size", 2))
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(min(3, vocab - 1), vocab, (batch, prompt), generator=gen)


def _keeps_last_logits(model: nn.Module) -> dict:
    # A server computes the output head for the last position only (generate() does too).
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def cache_name(model: nn.Module) -> str:
    """The name of the KV cache in the model's forward and its output: transformers 5 renamed
    `past_key_values` to `cache` (5.24 has `cache`, 5.17 `past_key_values`; both supported)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def prefill(model: nn.Module, ids: torch.Tensor) -> tuple:
    """The prompt's forward with the KV cache on: (the filled cache, the next token of each sequence)."""
    out = model(input_ids=ids, use_cache=True, **_keeps_last_logits(model))
    return getattr(out, cache_name(model)), out.logits[:, -1:].argmax(-1)


def decode(model: nn.Module, cache, next_ids: torch.Tensor, tokens: int) -> tuple:
    """`tokens` greedy steps, one token per sequence each, reading and growing `cache`."""
    extra, name = _keeps_last_logits(model), cache_name(model)
    for _ in range(tokens):
        out = model(input_ids=next_ids, use_cache=True, **{name: cache}, **extra)
        cache, next_ids = getattr(out, name), out.logits[:, -1:].argmax(-1)
    return cache, next_ids


def generate_once(model: nn.Module, ids: torch.Tensor, tokens: int) -> dict[str, float]:
    """Prefill `ids`, then `tokens` decode steps; milliseconds of each phase.

    No attention mask: the prompts are unpadded, as a server's batch of equal-length
    prompts is, so attention takes its causal fast path in both phases."""
    finished(model)
    start = time.perf_counter()
    cache, next_ids = prefill(model, ids)
    finished(model)
    prefilled = time.perf_counter()
    decode(model, cache, next_ids, tokens)
    finished(model)
    done = time.perf_counter()
    return {"prefill": (prefilled - start) * 1000.0, "decode": (done - prefilled) * 1000.0}


def measure_generation(
    models: Mapping[str, nn.Module],
    batch: int,
    prompt: int,
    tokens: int,
    repeats: int,
    warmup: int,
    threads: int | None,
) -> dict[str, dict[str, Latency]]:
    """Prefill and decode latency of each model on the same prompts, interleaved."""
    runs = {
        name: partial(generate_once, model, prompt_ids(model, batch, prompt).to(input_device(model)), tokens)
        for name, model in models.items()
    }
    return measure_runs(runs, repeats, warmup, threads)
