"""The text a small causal LM is trained on: Debian package descriptions, split by source.

Debian's `Translation-en` index holds every package's long description (a few
paragraphs of plain English about what the software does). apt only downloads it
when told to, so by default this reads the lists apt already has and, when they hold
no translations, says how to fetch them into a private folder without touching the
system's own lists:

    apt-get update -o Dir::State::Lists=DIR -o Acquire::Languages=en -o Debug::NoLocking=1

One document per distinct description (binary packages of one source often share
it), written on one line. The split is by a hash of the *source* package, so a
held-out description never shares its source with a training one (no -dev/-doc twin
of a validation text is seen in training). Any plain text file (one document a line)
can stand in for the Debian corpus; its documents are split by a hash of the line.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Buckets 0..99 of the source hash: train below 90, calibration 90-94, validation 95-99.
SPLITS = (("train", 0, 90), ("calib", 90, 95), ("valid", 95, 100))


class CorpusError(Exception):
    """The corpus cannot be read (no apt lists, no translations, an unreadable file)."""


@dataclass(frozen=True)
class Document:
    source: str  # what the split hashes: the Debian source package, or the line itself
    text: str


def bucket(key: str) -> int:
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) % 100


def split_of(key: str) -> str:
    b = bucket(key)
    return next(name for name, low, high in SPLITS if low <= b < high)


def split_documents(docs: list[Document]) -> dict[str, list[str]]:
    """Texts per split, in a fixed order (sorted by the hash of the text, a stable shuffle)."""
    out: dict[str, list[str]] = {name: [] for name, _, _ in SPLITS}
    for doc in docs:
        out[split_of(doc.source)].append(doc.text)
    for texts in out.values():
        texts.sort(key=lambda t: hashlib.sha256(t.encode("utf-8")).digest())
    return out


def text_file_documents(path: Path) -> list[Document]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CorpusError(f"cannot read {path}: {exc}") from None
    seen, docs = set(), []
    for line in (" ".join(line.split()) for line in lines):
        if line and line not in seen:
            seen.add(line)
            docs.append(Document(line, line))
    return docs


def debian_documents(lists: Path | None) -> list[Document]:
    """One document per distinct English description, keyed by its source package."""
    options = _apt_options(lists)
    targets = _index_files(options)
    translations = [f for kind, f in targets if kind == "Translations"]
    if not translations:
        where = lists or "/var/lib/apt/lists"
        raise CorpusError(
            f"apt's lists in {where} hold no Translation-en (long descriptions); fetch them with "
            "`apt-get update -o Dir::State::Lists=DIR -o Acquire::Languages=en -o Debug::NoLocking=1` "
            "and pass --apt-lists DIR"
        )
    sources = _sources([f for kind, f in targets if kind == "Packages"])
    by_text: dict[str, str] = {}
    for path in sorted(translations):
        for package, text in _descriptions(_cat(path)):
            source = sources.get(package, package)
            # The same text from several sources: keep the smallest source name, so the
            # document's split does not depend on the order the files are read in.
            if text not in by_text or source < by_text[text]:
                by_text[text] = source
    return [Document(source, text) for text, source in sorted(by_text.items())]


def _apt_options(lists: Path | None) -> list[str]:
    if lists is None:
        return []
    if not lists.is_dir():
        raise CorpusError(f"--apt-lists {lists} is not a folder")
    return ["-o", f"Dir::State::Lists={lists.resolve()}", "-o", "Acquire::Languages=en"]


def _run(command: list[str]) -> str:
    try:
        return subprocess.run(command, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CorpusError(f"{command[0]} failed ({exc}); the Debian corpus needs a Debian/Ubuntu machine") from None


def _index_files(options: list[str]) -> list[tuple[str, str]]:
    out = _run(["apt-get", "indextargets", *options, "--format", "$(IDENTIFIER) $(FILENAME)"])
    rows = [line.split(" ", 1) for line in out.splitlines() if " " in line]
    return [(kind, path) for kind, path in rows if Path(path).is_file()]


def _cat(path: str) -> str:
    # apt-helper decompresses whatever apt stored (lz4, xz, gz or plain).
    return _run(["/usr/lib/apt/apt-helper", "cat-file", path])


def _sources(packages_files: list[str]) -> dict[str, str]:
    sources: dict[str, str] = {}
    for path in sorted(packages_files):
        for stanza in _cat(path).split("\n\n"):
            name = re.search(r"^Package: (\S+)", stanza, re.M)
            if name:
                source = re.search(r"^Source: (\S+)", stanza, re.M)
                sources[name.group(1)] = source.group(1) if source else name.group(1)
    return sources


def _descriptions(index: str):
    """(package, one-line text) for each stanza: the short line, then the long paragraphs."""
    for stanza in index.split("\n\n"):
        name = re.search(r"^Package: (\S+)", stanza, re.M)
        body = re.search(r"^Description-en: (.*(?:\n .*)*)", stanza, re.M)
        if not name or not body:
            continue
        first, *rest = body.group(1).split("\n")
        lines = [first.strip()] + [line[1:] for line in rest]
        words = " ".join(line.strip() for line in lines if line.strip() != ".")
        text = " ".join(words.split())
        if text:
            yield name.group(1), text
