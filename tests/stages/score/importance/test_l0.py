"""l0 learned gates: probabilities in [0, 1]; a head that contributes nothing is closed."""

from __future__ import annotations

import torch

from headprune_cli.data.readers import Dataset
from headprune_cli.stages.score.importance import ScoreContext, score_model
from headprune_cli.stages.score.importance.l0 import L0, hard_concrete, open_probability
from tests.support import TINY, VOCAB


def _dataset(rows: int = 32) -> Dataset:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, VOCAB, (rows, 8), generator=gen)
    return Dataset(ids, torch.ones_like(ids), ids[:, 0] % 2)


def test_l0_scores_are_probabilities_and_a_dead_head_scores_low():
    model = TINY["reference"]()
    with torch.no_grad():  # layer 1, head 2 writes nothing: its output-projection columns are 0
        model.layers[1].attention.o_proj.weight[:, 16:24] = 0.0
    result = score_model(model, _dataset(), "l0", "fidelity", batch_size=16, seed=0)
    scores = [s for layer in result.heads.values() for s in layer.values()]
    assert all(0.0 <= s <= 1.0 for s in scores)
    dead = result.heads[1][2]
    others = [s for (layer, heads) in result.heads.items() for h, s in heads.items() if (layer, h) != (1, 2)]
    assert dead < 0.05 and dead < min(others)
    runs = [L0(steps=5).heads(ScoreContext(model, _dataset(), "fidelity", 16, seed=3)) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))  # deterministic


def test_hard_concrete_gates_are_clipped_to_the_unit_interval():
    u = torch.rand(1000, 3).clamp(1e-6, 1 - 1e-6)
    z = hard_concrete(torch.tensor([-5.0, 0.0, 5.0]), u)
    assert z.min() >= 0 and z.max() <= 1
    assert (z[:, 0] == 0).float().mean() > 0.9 and (z[:, 2] == 1).float().mean() > 0.9
    p = open_probability(torch.tensor([-5.0, 0.0, 5.0]))
    assert torch.all((p > 0) & (p < 1)) and p[0] < p[1] < p[2]
    assert abs(float((z[:, 1] > 0).float().mean()) - float(p[1])) < 0.05
