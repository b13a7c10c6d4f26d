"""The real-text corpus tool: paragraphs out of the handbook's HTML, a deterministic split."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.tools import handbook_corpus as hc

PAGE = """<html><body><div class="titlepage"><p class="title">6.2. apt-get</p></div>
<div class="para">First paragraph about <code class="command">apt</code> &amp; its friends.</div>
<pre class="screen"><div class="para">$ apt-get install foo</div></pre>
<div class="para">Second paragraph<div class="itemizedlist"><div class="para">nested item</div></div> ends.</div>
<div class="note"><div class="para">A note.</div></div></body></html>"""


def test_paragraphs_take_outermost_para_divs_without_code_blocks() -> None:
    assert hc.paragraphs(PAGE) == [
        "First paragraph about apt & its friends.",
        "Second paragraph nested item ends.",
        "A note.",
    ]


def test_lines_join_paragraphs_to_the_minimum_and_fold_a_short_tail() -> None:
    paras = ["a" * 300, "b" * 300, "c" * 600, "d" * 50]
    lines = hc.lines_of(paras, min_chars=512)
    assert lines == ["a" * 300 + " " + "b" * 300, "c" * 600 + " " + "d" * 50]
    assert hc.lines_of(["x" * 20], min_chars=512) == []  # too short to be a row


def _book(tmp_path: Path, sections: int) -> Path:
    for i in range(sections):
        body = "".join(f'<div class="para">Section {i} paragraph {j}. {"word " * 60}</div>' for j in range(4))
        (tmp_path / f"sect.s{i}.html").write_text(f"<html><body>{body}</body></html>", encoding="utf-8")
    return tmp_path


def test_split_is_deterministic_and_keeps_held_out_sections_whole(tmp_path: Path) -> None:
    (tmp_path / "html").mkdir()
    source = _book(tmp_path / "html", 40)
    first, second = hc.build(source), hc.build(source)
    assert first == second
    held = {line.split(" paragraph")[0] for line in first["heldout"]}
    fit = {line.split(" paragraph")[0] for line in first["train"] + first["calib"]}
    assert held and fit and not held & fit  # no section on both sides
    assert first["calib"] and first["train"]
    total = sum(len(v) for v in first.values())
    assert total == 40 * 2  # four 300-char paragraphs -> two lines a section


def test_write_names_source_and_digests(tmp_path: Path) -> None:
    (tmp_path / "html").mkdir()
    source = _book(tmp_path / "html", 12)
    readme = hc.write(tmp_path / "out", hc.build(source), source)
    for name in hc.SPLITS:
        assert (tmp_path / "out" / f"{name}.txt").is_file()
        assert f"{name}.txt:" in readme
    assert "debian-handbook" in (tmp_path / "out" / "README").read_text()


def test_missing_handbook_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert hc.main(["--out", str(tmp_path / "out"), "--source", str(tmp_path / "absent")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and err.count("\n") == 1 and "apt-get install debian-handbook" in err
    assert not (tmp_path / "out").exists()
