"""A candidate's measured loss: the model with a plan's heads and neurons gated to 0 and its
layers skipped, on held-out data (gating equals removal exactly, so no copy is cut)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

from headprune_cli.data.readers import as_batch, num_batches
from headprune_cli.model.ffn import removal_ffn_gates
from headprune_cli.model.surgery import HeadGates, NeuronGates, removal_gates, skip_layers
from headprune_cli.runtime.device import input_device
from headprune_cli.stages.objectives import check_finite, embed, per_example_loss


class MaskedLoss:
    """The mean loss of the model with a plan's heads gated to 0 and its layers skipped."""

    def __init__(self, model, dataset, objective: str, batch_size: int):

        self.model, self.objective, self.count = model, objective, len(dataset)
        device = input_device(model)
        self.batches = []
        for number in range(num_batches(dataset, batch_size)):
            batch = as_batch(dataset.select(number * batch_size, (number + 1) * batch_size))
            self.batches.append({k: v.to(device) for k, v in batch.items()})
        with torch.no_grad():  # fidelity compares with the unpruned model's own outputs
            self.references = [embed(model, b) for b in self.batches]

    def __call__(
        self,
        remove_heads: dict[int, list[int]],
        remove_layers: list[int],
        remove_ffn: dict[int, list[int]] | None = None,
    ) -> float:

        return self.measure(remove_heads, remove_layers, remove_ffn)[0]

    def measure(
        self,
        remove_heads: dict[int, list[int]],
        remove_layers: list[int],
        remove_ffn: dict[int, list[int]] | None = None,
        weights: AbstractContextManager | None = None,
    ) -> tuple[float, float | None]:
        """(mean loss, accuracy: None unless the objective is classification); `weights` puts
        the candidate's compensated weights in place for the measurement (refit.py)."""
        total, correct = 0.0, 0
        neurons = NeuronGates(self.model, removal_ffn_gates(self.model, remove_ffn)) if remove_ffn else nullcontext()
        with (
            torch.no_grad(),
            weights or nullcontext(),
            HeadGates(self.model, removal_gates(self.model, remove_heads)),
            neurons,
            skip_layers(self.model, remove_layers),
        ):
            for number, (batch, reference) in enumerate(zip(self.batches, self.references)):
                out = embed(self.model, batch)
                losses = per_example_loss(out, batch, self.objective, reference).double()
                check_finite(losses, f"held-out batch {number}")
                total += float(losses.sum())
                if self.objective == "classification":
                    correct += int((out.argmax(-1) == batch["labels"]).sum())
        accuracy = correct / self.count if self.objective == "classification" else None
        return total / self.count, accuracy
