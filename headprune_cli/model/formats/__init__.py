"""One module per engine format a checkpoint is written in: the HF folder (hf, hf_config, and
sentence_transformers for embedding models), vLLM's nemotron-nas folder (vllm), llama.cpp's GGUF
(gguf, gguf_vocab), ONNX (onnx, onnx_quantize); engines says which of them load a checkpoint."""
