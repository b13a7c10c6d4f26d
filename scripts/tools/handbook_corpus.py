"""The real-text corpus for LLM calibration and evaluation: The Debian Administrator's Handbook.

Debian's `debian-handbook` package (GPL-2.0+ or CC-BY-SA-3.0, by Raphaël Hertzog and Roland
Mas) installs the whole book as HTML; its English edition is about 950 kB of prose in some
3,000 paragraphs: explanations of how a Debian system works, not command listings. The set-up
scripts install the package (scripts/_env.sh); by hand: `apt-get install debian-handbook`.

What this writes, deterministically (same package version -> byte-identical files):
- the paragraphs of each section page (`<div class="para">`, code blocks left out), one
  whitespace-normalised line per paragraph, consecutive paragraphs of a section joined until
  a line holds at least MIN_CHARS characters (about 120 tokens for a BPE tokenizer: a
  `--seq-len 128` row is mostly filled);
- held out by a hash of the section's file name (15 of 100 buckets), so held-out text never
  shares a section with calibration or training text: `heldout.txt` is for report only, never
  for scoring, compensation or training; the other sections' lines split by a hash of the
  line into `calib.txt` (25 of 100: score / select / prune --data) and `train.txt` (recovery);
- `README` naming the source, its version, the command, and each file's sha256.

    python -m scripts.tools.handbook_corpus --out /work/corpus
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

DEFAULT_SOURCE = Path("/usr/share/doc/debian-handbook/html/en-US")
PACKAGE = "debian-handbook"
MIN_CHARS = 512
MIN_LINE = 100  # a section holding one caption-sized paragraph adds no row worth scoring
# Buckets 0..99 of the section hash: held-out sections, the rest split line by line into
# calibration (a hash of the line, 25 of 100) and training text.
HELDOUT = 85
CALIB = 25
SPLITS = ("train", "calib", "heldout")
_SKIPPED = ("pre", "script", "style")
_BLOCKS = ("div", "p", "li", "br", "td", "dt", "dd")


class CorpusError(Exception):
    """The handbook is not installed or cannot be read."""


class _Paragraphs(HTMLParser):
    """Text of the outermost `<div class="para">` elements, code blocks left out."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.divs: list[bool] = []  # for each open div: does it start a paragraph
        self.skipping = 0
        self.buffer: list[str] | None = None
        self.paragraphs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.buffer is not None and tag in _BLOCKS:
            self.buffer.append(" ")  # a block boundary separates words even with no space in the HTML
        if tag == "div":
            starts = self.buffer is None and dict(attrs).get("class") == "para"
            self.divs.append(starts)
            if starts:
                self.buffer = []
        elif tag in _SKIPPED:
            self.skipping += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "div" and self.divs:
            if self.divs.pop() and self.buffer is not None:
                text = " ".join("".join(self.buffer).split())
                self.buffer = None
                if text:
                    self.paragraphs.append(text)
        elif tag in _SKIPPED and self.skipping:
            self.skipping -= 1

    def handle_data(self, data: str) -> None:
        if self.buffer is not None and not self.skipping:
            self.buffer.append(data)


def paragraphs(html: str) -> list[str]:
    parser = _Paragraphs()
    parser.feed(html)
    parser.close()
    return parser.paragraphs


def lines_of(paras: list[str], min_chars: int = MIN_CHARS) -> list[str]:
    """Consecutive paragraphs joined until a line holds at least min_chars characters."""
    lines: list[str] = []
    current: list[str] = []
    for para in paras:
        current.append(para)
        if sum(len(p) + 1 for p in current) > min_chars:
            lines.append(" ".join(current))
            current = []
    if current:
        tail = " ".join(current)
        if lines and len(tail) < min_chars // 2:
            lines[-1] += " " + tail  # a short last paragraph joins the line before it
        else:
            lines.append(tail)
    return [line for line in lines if len(line) >= MIN_LINE]


def bucket(key: str) -> int:
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) % 100


def split_of(section: str, line: str) -> str:
    if bucket(section) >= HELDOUT:
        return "heldout"
    return "calib" if bucket(line) < CALIB else "train"


def build(source: Path, min_chars: int = MIN_CHARS) -> dict[str, list[str]]:
    """Lines per split; sections in file-name order, paragraphs in page order."""
    pages = sorted(source.glob("*.html")) if source.is_dir() else []
    if not pages:
        raise CorpusError(
            f"{source} holds no handbook pages: install Debian's `{PACKAGE}` package "
            f"(apt-get install {PACKAGE}) or pass --source DIR"
        )
    out: dict[str, list[str]] = {name: [] for name in SPLITS}
    for page in pages:
        try:
            html = page.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CorpusError(f"cannot read {page}: {exc}") from None
        for line in lines_of(paragraphs(html), min_chars):
            out[split_of(page.name, line)].append(line)
    return out


def package_version() -> str:
    try:
        done = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", PACKAGE], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not installed through dpkg)"
    return done.stdout.strip()


def write(out_dir: Path, splits: dict[str, list[str]], source: Path) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, lines in splits.items():
        data = ("\n".join(lines) + "\n").encode("utf-8")
        (out_dir / f"{name}.txt").write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        rows.append(f"- {name}.txt: {len(lines)} lines, {len(data):,} bytes, sha256 {digest}")
    readme = "\n".join(
        [
            "Real-text corpus for LLM calibration and evaluation",
            "",
            f"Source: The Debian Administrator's Handbook, Debian package `{PACKAGE}` version "
            f"{package_version()} (GPL-2.0+ or CC-BY-SA-3.0), English HTML in {source}.",
            "Made by: python -m scripts.tools.handbook_corpus --out DIR   (headprune repository;",
            "scripts/_env.sh installs the package). One line = consecutive paragraphs of one section",
            f"(code blocks left out) joined to at least {MIN_CHARS} characters. heldout.txt holds whole",
            "sections (a hash of the section's file name); the other sections' lines split into",
            "calib.txt and train.txt by a hash of the line.",
            "",
            *rows,
            "",
            "calib.txt: calibration (score, select, prune --data). train.txt: recovery training.",
            "heldout.txt: evaluation ONLY (report); never for scoring, compensation or training.",
            "",
        ]
    )
    (out_dir / "README").write_text(readme, encoding="utf-8")
    return readme


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for train/calib/heldout.txt and README")
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the handbook's English HTML folder")
    args = parser.parse_args(argv)
    try:
        splits = build(args.source)
    except CorpusError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    print(write(args.out, splits, args.source), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
