"""A pruned sentence-transformers MiniLM (uneven heads per layer) exports as a
sentence-transformers folder with onnx/model.onnx, served without headprune."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

import headprune_cli
from headprune_cli.model.surgery import apply_plan
from tests.support import run_without_headprune

SENTENCES = ["Pruning attention heads makes models faster.", "A cat sat on the mat, quite content.", "Short."]

# 1. SentenceTransformer(folder, backend="onnx"), the route the issue asks for. It needs
#    optimum-onnx, whose releases pin transformers < 4.58 while sentence-transformers 6
#    needs transformers 5: where optimum cannot be imported the failure is recorded.
# 2. The nearest route that runs here: onnxruntime on onnx/model.onnx, the folder's
#    tokenizer, and sentence-transformers' own Pooling and Normalize modules loaded from
#    the folder's module configs.
SERVE = """
import json
import numpy as np
import onnxruntime as ort
import torch
from safetensors.torch import save_file
from sentence_transformers import SentenceTransformer
from sentence_transformers.models import Normalize, Pooling
from transformers import AutoTokenizer

folder, sentences = sys.argv[1], json.loads(sys.argv[2])
out, report = {}, {}
try:
    model = SentenceTransformer(folder, backend="onnx", device="cpu")
    out["st_onnx"] = model.encode(sentences, convert_to_tensor=True).cpu()
except Exception as exc:
    report["st_onnx_error"] = str(exc).splitlines()[0]

modules = json.load(open(f"{folder}/modules.json"))
assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
limit = json.load(open(f"{folder}/sentence_bert_config.json"))["max_seq_length"]
tokenizer = AutoTokenizer.from_pretrained(folder)
session = ort.InferenceSession(f"{folder}/onnx/model.onnx", providers=["CPUExecutionProvider"])
batch = tokenizer(sentences, padding=True, truncation=True, max_length=limit, return_tensors="np")
names = [i.name for i in session.get_inputs()]
(hidden,) = session.run(None, {n: batch[n].astype(np.int64) for n in names})
features = {"token_embeddings": torch.from_numpy(hidden), "attention_mask": torch.from_numpy(batch["attention_mask"])}
features = Pooling.load(folder, subfolder="1_Pooling")(features)
out["ort"] = Normalize()(features)["sentence_embedding"]
save_file(out, "embeddings.safetensors")
print(json.dumps(report))
"""


def headprune_embeddings(model, tokenizer_folder) -> torch.Tensor:
    from transformers import AutoTokenizer

    batch = AutoTokenizer.from_pretrained(str(tokenizer_folder))(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def test_pruned_minilm_serves_through_onnx_without_headprune(minilm_dir, tmp_path, cli):
    assert cli("import", minilm_dir, "-o", tmp_path / "minilm.safetensors").code == 0
    model = headprune_cli.load(tmp_path / "minilm.safetensors")
    apply_plan(model, {0: [0, 1, 2], 1: [5], 3: [0, 2, 4, 6, 8, 10], 5: [11]}, [])  # 9, 11, 12, 6, 12, 11 heads
    headprune_cli.save(model, tmp_path / "small.safetensors")
    res = cli("export", tmp_path / "small.safetensors", "--hf", tmp_path / "small")
    assert res.code == 0, res.err
    assert "onnx/model.onnx" in res.err
    folder = tmp_path / "small"
    assert json.loads((folder / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"] is True
    assert json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"] == 256  # from the import

    report = json.loads(
        run_without_headprune(SERVE, tmp_path, str(folder), json.dumps(SENTENCES)).strip().splitlines()[-1]
    )
    got = load_file(tmp_path / "embeddings.safetensors")
    want = headprune_embeddings(headprune_cli.load(tmp_path / "small.safetensors"), minilm_dir)
    routes = ["ort"] + (["st_onnx"] if "st_onnx" in got else [])
    if "st_onnx" not in got:  # the known gap, and only that one
        assert "Optimum" in report["st_onnx_error"], report
    for route in routes:
        cosine = torch.nn.functional.cosine_similarity(got[route], want)
        assert cosine.min() >= 0.9999, (route, cosine)
    # The pruning is real: the unpruned model's embeddings differ.
    full = headprune_embeddings(headprune_cli.load(tmp_path / "minilm.safetensors"), minilm_dir)
    assert torch.nn.functional.cosine_similarity(full, want).min() < 0.999
