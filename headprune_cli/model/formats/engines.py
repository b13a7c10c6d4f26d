"""Which serving engines load a checkpoint, and through which export (inspect, export).

Each answer comes from the writer that would make the file, run on the checkpoint's metadata
alone (no weight is read), so what `inspect` promises is what `export` then writes:
- transformers: `export --hf` writes a plain folder (formats.hf_config.folder_config says whether).
- vllm: `export --vllm` (nemotron-nas, formats.vllm.nas_plan), or a plain `export --hf` folder of
  a causal LM (vLLM loads the families transformers does).
- llama.cpp: `export --gguf` (formats.gguf.gguf_plan, and a tokenizer llama.cpp reproduces).
- onnxruntime: `export --onnx` states every layer's shapes: every checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from headprune_cli.errors import HeadpruneError
from headprune_cli.model.formats.gguf import gguf_plan
from headprune_cli.model.formats.gguf_vocab import gguf_vocab
from headprune_cli.model.formats.hf_config import folder_config
from headprune_cli.model.formats.vllm import nas_plan
from headprune_cli.model.layout import ModelInfo


@dataclass
class Serving:
    engine: str
    export: str  # the export that writes what the engine loads ("" when none does)
    why: str = ""  # when none does: the writer's refusal

    @property
    def loads(self) -> bool:
        return bool(self.export)


def serving(info: ModelInfo) -> list[Serving]:
    """transformers, vllm, llama.cpp and onnxruntime, in that order."""
    plain = folder_config(info)
    vllm = _refusal(lambda: nas_plan(info))
    gguf = _refusal(
        lambda: (gguf_plan(info), gguf_vocab(info.tokenizer, info.tokenizer_config, info.config["vocab_size"]))
    )
    if plain.plain and info.task == "causal-lm":  # the plain folder: vLLM's own class for the family
        vllm_way = Serving("vllm", "--hf")
    else:
        vllm_way = Serving("vllm", "" if vllm else "--vllm", vllm)
    return [
        Serving("transformers", "--hf" if plain.plain else "", "" if plain.plain else plain.reason),
        vllm_way,
        Serving("llama.cpp", "" if gguf else "--gguf", gguf),
        Serving("onnxruntime", "--onnx"),
    ]


def _refusal(check) -> str:
    try:
        check()
    except HeadpruneError as exc:
        return str(exc)
    return ""


def serving_line(ways: list[Serving]) -> str:
    """One line for a person from `serving`'s answer: the engines that load it (and how), then those that do not."""
    loads = ", ".join(f"{s.engine} (export {s.export})" for s in ways if s.loads)
    refused = [s.engine for s in ways if not s.loads]
    return f"serves in: {loads}" + (f"; not in {', '.join(refused)} (`inspect --json` says why)" if refused else "")
