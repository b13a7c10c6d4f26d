"""llama.cpp loads headprune's GGUF files and computes headprune's logits (DESIGN invariant 10).

llama.cpp runs through llama-cpp-python in its own environment (scripts/engines/llama_cpp.sh),
in a process where headprune cannot be imported; it tokenizes the text itself, and both its
token ids and its logits at every position are compared with headprune's. The KV cache is kept
in f32 there (llama.cpp's default is f16), so an f32 file must match to float tolerance.

Run: `python -m pytest -m engines tests/engines` (deselected from the default suite; .ci/run runs it).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers as T
from tokenizers import Tokenizer

import headprune_cli
from headprune_cli.model.layout import info_of
from tests.support import run_without_headprune
from tests.support.engines import llama_cpp_python
from tests.support.gguf_models import NON_UNIFORM, UNIFORM, tiny_llama, write_checkpoint

pytestmark = pytest.mark.engines

TEXTS = [
    "The package provides a library for parsing configuration files.",
    "numbers 12345 and 3.14, punctuation!? -- (brackets) [x]  two  spaces\nnew line\ttab",
    "Ünïcödé wörds, 日本語 and emoji 🙂 stay byte-level.",
]
# Max |llama.cpp - headprune| over every logit, as a fraction of the largest |logit| headprune
# gives. f32: float tolerance. f16/q8_0/q4_0: the bounds measured on these models
# (see the report of issue #38), with headroom.
BOUNDS = {"f32": 1e-4, "f16": 5e-3, "q8_0": 2e-2, "q4_0": 0.15}

ENGINE = """
import json, sys
import numpy as np
from llama_cpp import Llama

path, texts = sys.argv[1], json.loads(sys.argv[2])
GGML_TYPE_F32 = 0
llm = Llama(model_path=path, n_ctx=256, n_batch=256, n_threads=2, logits_all=True,
            type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, verbose=False)
out = {"arch": llm.metadata["general.architecture"], "runs": []}
for text in texts:
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    llm.reset()
    llm.eval(ids)
    out["runs"].append({"ids": ids, "logits": np.asarray(llm.scores[: len(ids)], dtype=np.float64).tolist()})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def engine() -> str:
    return llama_cpp_python()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-cpp")
    return {
        "uniform": write_checkpoint(folder / "uniform.safetensors", UNIFORM),
        "non-uniform": write_checkpoint(folder / "non_uniform.safetensors", NON_UNIFORM),
        # Qwen2 goes out as `llama` (with its q/k/v biases), Qwen3 as `qwen3` (q/k norms, no permutation).
        "qwen2-uniform": write_checkpoint(
            folder / "qwen2.safetensors", UNIFORM, tiny_llama(T.Qwen2ForCausalLM, T.Qwen2Config)
        ),
        "qwen3-uniform": write_checkpoint(
            folder / "qwen3.safetensors", UNIFORM, tiny_llama(T.Qwen3ForCausalLM, T.Qwen3Config)
        ),
    }


def headprune_logits(checkpoint) -> tuple[list[list[int]], list[np.ndarray]]:
    model = headprune_cli.load(checkpoint)
    tokenizer = Tokenizer.from_str(info_of(model).tokenizer)
    ids = [tokenizer.encode(text).ids for text in TEXTS]
    with torch.no_grad():
        logits = [model(torch.tensor([row])).logits[0].double().numpy() for row in ids]
    return ids, logits


def llama_cpp_run(engine: str, gguf) -> dict:
    out = run_without_headprune(ENGINE, gguf.parent, str(gguf), json.dumps(TEXTS), python=engine)
    return json.loads(out.strip().splitlines()[-1])


def export(cli, checkpoint, kind: str):
    out = checkpoint.with_name(f"{checkpoint.stem}-{kind}.gguf")
    result = cli("export", checkpoint, "--gguf", out, "--gguf-type", kind, "--force")
    assert result.code == 0, result
    return out


@pytest.mark.parametrize(
    "cut, kind, arch",
    [
        ("uniform", "f32", "llama"),
        ("non-uniform", "f32", "deci"),
        ("uniform", "q8_0", "llama"),
        ("non-uniform", "f16", "deci"),
        ("non-uniform", "q8_0", "deci"),
        ("non-uniform", "q4_0", "deci"),
        ("qwen2-uniform", "f32", "llama"),
        ("qwen3-uniform", "f32", "qwen3"),
    ],
)
def test_llama_cpp_tokenizes_and_computes_as_headprune(engine, checkpoints, cli, cut, kind, arch):
    ids, ours = headprune_logits(checkpoints[cut])
    theirs = llama_cpp_run(engine, export(cli, checkpoints[cut], kind))
    assert theirs["arch"] == arch
    assert [run["ids"] for run in theirs["runs"]] == ids  # llama.cpp's tokenizer = transformers'
    worst = max(
        np.abs(np.asarray(run["logits"]) - mine).max() / np.abs(mine).max() for run, mine in zip(theirs["runs"], ours)
    )
    print(f"{cut} {kind}: max |llama.cpp - headprune| / max |logit| = {worst:.2e}")
    assert worst < BOUNDS[kind], worst
