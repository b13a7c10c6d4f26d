"""`headprune export` (the stage: stages/export/stage.py)."""

from __future__ import annotations

from headprune_cli.cli.command import from_options
from headprune_cli.cli.common import context
from headprune_cli.stages.export import stage


@from_options(stage.ExportOptions)
def export(opts: stage.ExportOptions):
    """Export a (pruned) checkpoint for deployment: an ONNX file or an HF-style folder.

    The ONNX file takes input_ids + attention_mask (pixel_values for ViT) and returns
    logits (last_hidden_state for base models); a causal LM's file also takes
    position_ids and past_key_values.N.key/value and returns present.N.key/value, so
    onnxruntime can decode. Each file is checked against PyTorch in onnxruntime before it
    is written; models of 2 GB or more keep their weights in FILE.data beside it.
    --quantize int8-dynamic|int8-static (encoders) writes it through
    onnxruntime's quantizer, run in onnxruntime before it is moved into
    place; `report --onnx` measures what it kept.

    The folder loads back with `headprune_cli.load(DIR)` and re-imports with
    `headprune import DIR -o x.safetensors`. A LLaMA/Mistral/Qwen model whose layers keep
    the same heads (`select --uniform`) also loads in plain transformers
    (AutoModelForCausalLM.from_pretrained(DIR)); other layouts are kept from loading
    there with wrong shapes and serve through DIR/onnx/model.onnx (--with-onnx).
    Sentence-transformers models get modules.json, pooling and onnx/model.onnx.

    --vllm DIR writes a folder vLLM serves (`vllm serve DIR --trust-remote-code`)
    for LLaMA/Mistral/Qwen2 cuts with one query-head count and per-layer KV heads
    and FFN widths (`select --runtime vllm`); --gguf FILE one llama.cpp loads
    (--gguf-type q8_0/q4_0/...: a cut chosen with `select --runtime llama.cpp
    --gguf-type T`, whose widths are on T's quantization blocks; q4_K_M/q5_K_M/q6_K
    are quantized by llama.cpp's own quantizer in its engine environment).

    Examples:

      headprune export small.safetensors --onnx small.onnx

      headprune export small.safetensors --onnx small-int8.onnx --quantize int8-dynamic   # encoders: int8 weights

      headprune export small.safetensors --hf small-model/

      headprune export small-minilm.safetensors --hf small-minilm/   # + onnx/model.onnx

      headprune export small-llama.safetensors --vllm small-llama-vllm/   # nemotron-nas folder for vLLM

      headprune export small-llama.safetensors --gguf small-q4km.gguf --gguf-type q4_K_M   # llama.cpp
    """
    return stage.run(opts, context())
