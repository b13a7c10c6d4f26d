"""scripts/benchmarks/decode.py (BENCHMARKS.md's decode block) in quick mode, so it cannot rot: the KV
cache it predicts equals what transformers' cache holds, and `python -m scripts.benchmarks.suite --only decode`
replaces that one block of an existing file, leaving the rest as it was."""

from __future__ import annotations

import json

from scripts.benchmarks import suite


def test_decode_section_alone_replaces_only_its_section(tmp_path):
    out, raw = tmp_path / "bench.md", tmp_path / "bench.json"
    before = (
        "# headprune benchmarks\n\n## How fast\n\nkept\n\n<!-- suite: decode -->\n### Serving a causal LM: KV cache, "
        "prefill and decode\n\nold numbers\n<!-- /suite: decode -->\n\n## Later\n\nalso kept\n"
    )
    out.write_text(before)
    assert suite.main(["--quick", "--only", "decode", "--out", str(out), "--json", str(raw)]) == 0
    text = out.read_text()
    assert "old numbers" not in text and text.count("### Serving a causal LM") == 1
    assert text.startswith("# headprune benchmarks\n\n## How fast\n\nkept\n\n<!-- suite: decode -->\n### Serving")
    assert text.endswith("<!-- /suite: decode -->\n\n## Later\n\nalso kept\n")
    assert "measured alone: `OMP_NUM_THREADS=" in text and "--only decode" in text
    result = json.loads(raw.read_text())
    assert set(result) >= {"decode", "machine", "command"} and "speed" not in result  # nothing else was measured
    rows = result["decode"]["rows"]
    assert [r["batch"] for r in rows] == [1, 2]
    for r in rows:
        kv = r["kv_bytes_per_token"]
        assert kv == {"baseline": 256, "pruned": 128} and r["kv_ratio"] == 0.5
        assert r["kv_measured"] == {
            "baseline": 256.0,
            "pruned": 128.0,
        }  # the prediction is the cache transformers fills
        assert r["predicted_decode"] > 1 and r["predicted_prefill"] > 1
        assert r["measured_decode"] > 0 and r["measured_prefill"] > 0
        assert r["decode_ms"]["baseline"]["runs"] == 2 and r["prefill_ms"]["pruned"]["runs"] == 1
        assert f"| {r['batch']} | 256 → 128 (256 → 128), -50% |" in text
