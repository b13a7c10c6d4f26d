"""Datasets: JSONL/CSV/text/tensor readers into model-ready batches (readers), and the guard
around a checkpoint's own tokenizer (tokenizer_guard)."""
