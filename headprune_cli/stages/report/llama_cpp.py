"""`report --gguf FILE`: the shipped GGUF file, run in llama.cpp, stands in for the pruned
PyTorch model in quality, speed and the gates, as `report --onnx` does for onnxruntime.

llama.cpp runs through llama-cpp-python in its own environment (scripts/engines/llama_cpp.sh),
where headprune cannot be imported, so the file is evaluated by a long-lived child process of
that environment's python: GgufModel sends it a batch of token ids (an .npy file in a private
temporary folder) and reads back the logits llama.cpp computes at every position, so the usual
evaluation (objectives.evaluate, on the token rows headprune's reader makes) and the usual
timing loop run on it unchanged. One batch at a time crosses, so memory stays bounded. The KV
cache is f32 (llama.cpp's default is f16), as in tests/engines/test_llama_cpp.py, so an f32 file
gives the checkpoint's perplexity to float tolerance and a quantized one only its own loss.

A GGUF file names no checkpoint, so it is refused when llama.cpp's metadata (architecture,
block count, vocabulary) is not what `export --gguf` would write for --model, or when its
logits on a probe row are not the checkpoint's (correlation below PROBE_MIN_CORRELATION).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import weakref
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from headprune_cli.errors import ArchitectureError, CheckpointError, UsageError
from headprune_cli.files.io import sha256_file
from headprune_cli.model.formats.gguf import gguf_plan
from headprune_cli.model.formats.gguf_grid import GGUF_TYPES
from headprune_cli.model.layout import info_of
from headprune_cli.stages.report.shipped import check_shipped_file

ENGINE = "llama.cpp"
MAGIC = b"GGUF"
# A file of another model gives logits unrelated to the checkpoint's (correlation near 0); q4_0 of
# a random-weight test model still correlates above 0.85, a trained model's far higher.
PROBE_MIN_CORRELATION = 0.5
PROBE_IDS = [1, 5, 9, 13, 17, 21, 25, 29]
REPLY = "@@headprune "  # marks the child's replies among anything a library prints to stdout

# The child: loads the file once, then answers one request per stdin line
# ({"ids": .npy of [B, T] int64, "lengths": [B], "out": .npy path}) with the logits of every
# row's real tokens (padding positions left 0; the evaluation masks them). Rows are evaluated
# one by one from an empty cache, as headprune's forward sees each row on its own.
CHILD = r"""
import json, sys
import numpy as np
import llama_cpp
from llama_cpp import Llama

path, n_ctx, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
REPLY = "@@headprune "
GGML_TYPE_F32 = 0
llm = Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads, n_threads_batch=threads,
            logits_all=True, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, verbose=False)
arch = llm.metadata.get("general.architecture", "")
facts = {"arch": arch, "blocks": int(llm.metadata.get(arch + ".block_count", -1)), "vocab": llm.n_vocab(),
         "file_type": int(llm.metadata.get("general.file_type", -1)), "version": llama_cpp.__version__}
print(REPLY + json.dumps(facts), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    try:
        ids = np.load(request["ids"])
        logits = np.zeros((*ids.shape, facts["vocab"]), dtype=np.float32)
        for row, length in enumerate(request["lengths"]):
            llm.reset()
            llm.eval(ids[row, :length].tolist())
            logits[row, :length] = llm.scores[:length]
        np.save(request["out"], logits)
        print(REPLY + json.dumps({"ok": True}), flush=True)
    except Exception as exc:
        print(REPLY + json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
"""


# --- before any work ------------------------------------------------------------------------
def check_gguf_options(gguf: Path | None, onnx: Path | None, device: str, dtype: str) -> None:
    """llama.cpp runs the file on the CPU in its own types; one shipped file per report."""
    if gguf is None:
        return
    if onnx is not None:
        raise UsageError("--gguf and --onnx each name the shipped file; pass one of them")
    check_shipped_file("--gguf", gguf, ENGINE, device, dtype)
    with open(gguf, "rb") as handle:
        if handle.read(len(MAGIC)) != MAGIC:
            raise CheckpointError(f"--gguf {gguf}: not a GGUF file (it does not start with {MAGIC.decode()})")


def check_task(info) -> None:
    if info.task != "causal-lm":
        raise UsageError(f"--gguf evaluates causal LMs exported with `export --gguf`; --model is a {info.task} model")


# --- the file as a model --------------------------------------------------------------------
class GgufModel(nn.Module):
    """A GGUF file in a llama.cpp child process, called like the checkpoint it was exported from."""

    def __init__(self, path: Path, checkpoint: nn.Module, python: Path, threads: int, n_ctx: int):
        super().__init__()
        self.config = checkpoint.config  # adapter_for and the data readers read the family from here
        self.headprune = info_of(checkpoint)  # info_of: tokenizer, task, layout
        self.path = path
        self.folder = Path(tempfile.mkdtemp(prefix="headprune-gguf-"))
        self._log = open(self.folder / "engine.log", "w+b")  # noqa: SIM115 (open for the child's life)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        self.child = subprocess.Popen(
            [str(python), "-I", "-c", CHILD, str(path), str(n_ctx), str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
        )
        # Whatever happens to the report (an error, Ctrl-C), the child and the folder go.
        self._finalizer = weakref.finalize(self, _stop, self.child, self._log, self.folder)
        self.facts = self._reply("llama.cpp cannot load it")
        self.calls = 0

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_) -> SimpleNamespace:
        ids = input_ids.detach().cpu().numpy().astype(np.int64)
        mask = np.ones_like(ids) if attention_mask is None else attention_mask.detach().cpu().numpy()
        self.calls += 1
        ids_file, out_file = self.folder / f"ids-{self.calls}.npy", self.folder / f"logits-{self.calls}.npy"
        np.save(ids_file, ids)
        lengths = [int(n) for n in mask.sum(axis=1)]  # rows are right-padded (data.readers)
        self._send({"ids": str(ids_file), "lengths": lengths, "out": str(out_file)})
        self._reply("llama.cpp failed on a batch")
        logits = torch.from_numpy(np.load(out_file))
        for done in (ids_file, out_file):  # one batch on disk at a time
            done.unlink()
        return SimpleNamespace(logits=logits)

    def close(self) -> None:
        self._finalizer()

    def _send(self, request: dict) -> None:
        try:
            self.child.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
            self.child.stdin.flush()  # type: ignore[union-attr]
        except BrokenPipeError:
            raise CheckpointError(f"--gguf {self.path}: llama.cpp stopped: {self._last_log_line()}") from None

    def _reply(self, what: str) -> dict:
        for line in self.child.stdout:  # type: ignore[union-attr]
            if line.startswith(REPLY):
                reply = json.loads(line[len(REPLY) :])
                if "error" in reply:
                    raise CheckpointError(f"--gguf {self.path}: {what}: {reply['error']}")
                return reply
        self.child.wait()
        raise CheckpointError(f"--gguf {self.path}: {what}: {self._last_log_line()}")

    def _last_log_line(self) -> str:
        self._log.flush()
        lines = (self.folder / "engine.log").read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else f"the engine exited with code {self.child.poll()}"


def _stop(child: subprocess.Popen, log, folder: Path) -> None:
    if child.poll() is None:
        child.stdin.close()  # type: ignore[union-attr]  # end of requests: the child's loop ends
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    child.stdout.close()  # type: ignore[union-attr]
    log.close()
    shutil.rmtree(folder, ignore_errors=True)


def load_gguf(path: Path, checkpoint: nn.Module, python: Path, threads: int, n_ctx: int) -> tuple[GgufModel, dict]:
    """The file as a model, and the report's `shipped` section (checkpoint metrics added later)."""
    info = info_of(checkpoint)
    check_task(info)
    plan = gguf_plan(info)  # what `export --gguf` writes for --model (refuses what it cannot write)
    model = GgufModel(path, checkpoint, python, threads, max(n_ctx, len(PROBE_IDS)))
    try:
        correlation = _check_matches(model, checkpoint, plan, info)
    except BaseException:
        model.close()
        raise
    section = {
        "path": str(path),
        "sha256": sha256_file(path),
        "engine": ENGINE,
        "engine_version": model.facts["version"],
        "quantization": _file_type(model.facts["file_type"]),
        "source_checked": False,  # a GGUF file names no checkpoint: metadata and a probe row stand in
        "bytes": os.path.getsize(path),
        "architecture": model.facts["arch"],
        "kv_cache": "f32",
        "probe_correlation": correlation,
        "checkpoint_metrics": [],
    }
    return model, section


def _file_type(number: int) -> str | None:
    """llama.cpp's general.file_type as `export --gguf-type` names it (MOSTLY_Q8_0 -> q8_0)."""
    import gguf  # noqa: PLC0415 (keeps gguf out of this module's import)

    try:
        name = gguf.LlamaFileType(number).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return None
    return next((kind for kind in GGUF_TYPES if kind.upper() == name), name.lower())


def _check_matches(model: GgufModel, checkpoint: nn.Module, plan, info) -> float:
    """llama.cpp's metadata and logits on a probe row are --model's: a file of another model is refused."""
    facts, vocab = model.facts, info.config["vocab_size"]
    want = {"arch": plan.arch, "blocks": len(plan.n_head), "vocab": vocab}
    got = {key: facts[key] for key in want}
    if got != want:
        raise ArchitectureError(
            f"--gguf {model.path} is a {got['arch']} model of {got['blocks']} blocks and {got['vocab']} tokens, "
            f"--model exports as {want['arch']}, {want['blocks']} blocks, {want['vocab']} tokens: "
            "it is not an export of --model"
        )
    ids = torch.tensor([[i % vocab for i in PROBE_IDS]])
    with torch.no_grad():
        ours = checkpoint(input_ids=ids, use_cache=False).logits.double().flatten()
    theirs = model(input_ids=ids).logits.double().flatten()
    correlation = float(np.corrcoef(ours.numpy(), theirs.numpy())[0, 1])
    if not correlation >= PROBE_MIN_CORRELATION:  # `not >=`: a NaN correlation is refused too
        raise CheckpointError(
            f"--gguf {model.path}: its logits on a probe row do not follow --model's (correlation "
            f"{correlation:.2f}): it is not an export of --model"
        )
    return correlation
