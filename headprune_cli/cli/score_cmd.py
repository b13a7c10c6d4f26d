"""`headprune score`."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from headprune_cli.model.checkpoint import load
from headprune_cli.data import position_limit, read_data
from headprune_cli.outputs import check_output
from headprune_cli.stages.importance import HEAD_METHODS, init_distributed, score_model, scores_artifact, world
from headprune_cli.stages.importance.api import make_scorer
from headprune_cli.stages.importance.baselines import parse_weights
from headprune_cli.stages.objectives import check_objective, needs_labels
from headprune_cli.schema import write_artifact
from headprune_cli.cli.common import Device, Dtype, console
from headprune_cli.device import check as check_device, dtype_name, place


def score(
    checkpoint: Annotated[Path, typer.Argument(help="A headprune checkpoint.")],
    data: Annotated[Path, typer.Option("--data", "-d", help="JSONL/CSV (text[, text_pair][, label]), plain text, or a tokenized .safetensors set.")],
    method: Annotated[str, typer.Option("--method", "-m", help=f"Importance method: {', '.join(HEAD_METHODS)}.")] = "taylor",
    objective: Annotated[str | None, typer.Option("--objective", help="classification, causal-lm or fidelity (default: from the model's task).")] = None,
    samples: Annotated[int | None, typer.Option("--samples", min=1, help="Use the first N examples.")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Examples per forward pass.")] = 32,
    max_length: Annotated[int, typer.Option("--max-length", min=1, help="Truncate sequences to this many tokens.")] = 128,
    seed: Annotated[int, typer.Option("--seed", help="Seed for random, fidelity probes and anything stochastic.")] = 0,
    layers: Annotated[bool, typer.Option("--layers", help="Also score whole layers.")] = False,
    layer_method: Annotated[str | None, typer.Option("--layer-method", help="refit (default: loss change when the layer is dropped and the rest refit briefly, what recovery can win back; about 12 training steps per layer), loo (the loss change with no refit: one forward per layer; for cuts that will not be finetuned) or cosine (block influence). refit and loo also measure each layer's attention, so `select --target-*` can weigh heads against layers.")] = None,
    weights: Annotated[list[str] | None, typer.Option("--weights", help="For combined: METHOD=WEIGHT[,METHOD=WEIGHT] (default taylor=1,loo=1).")] = None,
    normalize: Annotated[bool, typer.Option("--normalize/--no-normalize", help="gradient: divide each layer's scores by their L2 norm.")] = True,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the scores JSON here (default: stdout).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing output file.")] = False,
    device: Device = "auto",
    dtype: Dtype = "auto",
) -> None:
    """Score the importance of every attention head (and, with --layers, every layer).

    Runs unchanged under `torchrun --nproc-per-node N -m headprune_cli score ...`: each
    process scores a shard of the batches, sums are all-reduced, rank 0 writes.
    Scores are summed in float64 whatever --dtype the model computes in.

    Examples:

      headprune score model.safetensors --data dev.jsonl --method taylor -o scores.json

      headprune score lm.safetensors --data wiki.txt --method loo --layers --samples 256

      headprune score emb.safetensors --data sentences.txt --method combined --weights taylor=1,entropy=0.5
    """
    if output is not None and str(output) != "-":
        check_output(output, force, [checkpoint, data])
    make_scorer(method)  # an unknown name or device is answered before any model or data is read
    check_device(device, dtype)
    init_distributed()
    rank, _ = world()
    model = load(checkpoint)
    place(model, device, dtype)
    objective = check_objective(objective, model)
    max_length = min(max_length, position_limit(model) or max_length)  # the demo model has 64 positions
    dataset = read_data(data, model, max_length=max_length, samples=samples, seed=seed, need_labels=needs_labels(objective))
    chosen_weights = parse_weights(weights, list(HEAD_METHODS))
    if weights and method != "combined":
        raise typer.BadParameter("--weights only applies to --method combined", param_hint="--weights")
    # refit by default: on the real task it chose the layers that recovery wins back where
    # loo and cosine did not (BENCHMARKS.md §10), and it is on the loss scale joint selection needs.
    layer_method = (layer_method or "refit") if layers else None
    with _progress(rank == 0) as progress:
        result = score_model(
            model, dataset, method, objective, batch_size=batch_size, seed=seed, normalize=normalize,
            weights=chosen_weights, layers=layer_method, progress=progress,
        )
    if rank == 0:
        artifact = scores_artifact(model, result, model_path=checkpoint, data_path=data, max_length=max_length,
                                   extra_config={"samples": samples, **({"dtype": dtype_name(dtype)} if dtype_name(dtype) != "auto" else {})})
        write_artifact(artifact, output)
    _finish_distributed()


@contextmanager
def _progress(show: bool):
    """A rich progress bar on stderr; scorers open one task per pass over the data."""
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=True, disable=not show)

    def factory(description: str, total: int):
        task = bar.add_task(description, total=total)
        return lambda: bar.advance(task)

    with bar:
        yield factory


def _finish_distributed() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
