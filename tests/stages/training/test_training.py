"""Recovery training: it learns, KD to itself is a fixed point, resume is exact, bad input is refused."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from headprune_cli.errors import DataError, NumericalError, UsageError
from headprune_cli.stages.training.distill import check_compatible
from headprune_cli.stages.training.train import FinetuneConfig, Plan, default_lr, finetune
from tests.support import TINY, VOCAB


def _data(rows: int = 48, seq: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (rows, seq), generator=gen)
    mask = torch.ones_like(ids)
    mask[::3, -2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids[:, 0] % 2}


def _loss(model, data) -> float:
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(
            model(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits, data["labels"]
        ).item()


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_finetuning_lowers_the_training_loss():
    model, data = TINY["reference"](), _data()
    before = _loss(model, data)
    result = finetune(model, data, FinetuneConfig(epochs=6, lr=2e-3, batch_size=16, seed=1))
    assert result.completed and result.steps == 18
    assert _loss(result.model, data) < before - 0.05


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa"])
def test_causal_lm_recovery_lowers_next_token_loss(name):
    model = TINY[name]()
    data = _data(rows=16)
    data.pop("labels")
    first = finetune(model, data, FinetuneConfig(steps=1, lr=1e-9, batch_size=16)).first_loss
    result = finetune(model, data, FinetuneConfig(steps=12, lr=3e-3, batch_size=16, warmup=0))
    again = finetune(model, data, FinetuneConfig(steps=1, lr=1e-9, batch_size=16)).first_loss
    assert result.first_loss == pytest.approx(first, rel=1e-5)
    assert again < first - 0.1


def test_kd_with_weight_one_and_itself_as_teacher_keeps_the_model():
    model, data = TINY["reference"](), _data()
    teacher = TINY["reference"]()
    before = _weights(model)
    result = finetune(model, data, FinetuneConfig(epochs=2, lr=1e-3, batch_size=16, kd_weight=1.0), teacher=teacher)
    assert result.first_loss == pytest.approx(0.0, abs=1e-6)
    for name, value in _weights(result.model).items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=1e-7)


def test_kd_loss_pulls_a_student_towards_its_teacher():
    teacher, data = TINY["reference"](), _data()
    torch.manual_seed(5)
    student = TINY["reference"]()
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.05 * torch.randn_like(p))
    result = finetune(student, data, FinetuneConfig(epochs=4, lr=2e-3, batch_size=16, kd_weight=1.0), teacher=teacher)
    last = finetune(
        student, data, FinetuneConfig(steps=1, lr=1e-9, batch_size=48, kd_weight=1.0), teacher=teacher
    ).first_loss
    assert last < result.first_loss * 0.7


def test_resume_after_interruption_gives_the_same_weights(tmp_path):
    data = _data()
    cfg = dict(epochs=3, lr=1e-3, batch_size=8, grad_accum=2, seed=3, save_every=2)
    straight = finetune(TINY["bert"](), data, FinetuneConfig(**cfg)).model  # dropout on: RNG must resume too
    stopped = finetune(TINY["bert"](), data, FinetuneConfig(**cfg, state_dir=tmp_path / "st", stop_after=5))
    assert not stopped.completed and stopped.steps == 5
    resumed = finetune(TINY["bert"](), data, FinetuneConfig(**cfg, state_dir=tmp_path / "st", resume=True))
    assert resumed.completed and resumed.steps == 9
    for name, value in _weights(straight).items():
        torch.testing.assert_close(_weights(resumed.model)[name], value, rtol=0, atol=0)


def test_resume_refuses_changed_settings_and_missing_state(tmp_path):
    data = _data()
    finetune(TINY["reference"](), data, FinetuneConfig(steps=4, lr=1e-3, state_dir=tmp_path / "st", stop_after=2))
    with pytest.raises(UsageError, match="different settings"):
        finetune(TINY["reference"](), data, FinetuneConfig(steps=4, lr=5e-3, state_dir=tmp_path / "st", resume=True))
    with pytest.raises(UsageError, match="no training state"):
        finetune(TINY["reference"](), data, FinetuneConfig(steps=4, state_dir=tmp_path / "none", resume=True))


def test_eval_keeps_the_best_epoch():
    model, data = TINY["reference"](), _data()
    scores = iter([0.5, 0.9, 0.7, 0.6])
    result = finetune(
        model, data, FinetuneConfig(epochs=3, lr=1e-3, batch_size=16), eval_fn=lambda m: {"accuracy": next(scores)}
    )
    assert result.best_epoch == 1
    assert [r.metrics["accuracy"] for r in result.history] == [0.5, 0.9, 0.7, 0.6]


@pytest.mark.parametrize(
    ("values", "higher", "best"),
    [
        ([0.5, 0.9, 0.7, 0.6], True, 1),  # the middle epoch
        ([0.9, 0.3, 0.5, 0.4], False, 1),  # lower is better (perplexity)
        ([0.9, 0.5, 0.6, 0.7], True, 0),  # nothing beat the weights before training
        ([0.1, 0.2, 0.3, 0.4], True, 3),  # the last epoch
        ([0.5, 0.5, 0.9, 0.9], True, 2),  # a tie keeps the earlier epoch
    ],
)
def test_the_returned_weights_are_the_best_epochs(values, higher, best):
    """Checked on the weights themselves: those seen by the evaluation that scored best."""
    model, data = TINY["reference"](), _data()
    seen, scores = [], iter(values)

    def eval_fn(m):
        seen.append(_weights(m))
        return {"accuracy": next(scores)}

    result = finetune(
        model, data, FinetuneConfig(epochs=3, lr=1e-2, batch_size=16), eval_fn=eval_fn, higher_is_better=higher
    )
    assert result.best_epoch == best and len(seen) == 4
    final = _weights(result.model)
    for epoch, weights in enumerate(seen):
        same = all(torch.equal(final[k], weights[k]) for k in final)
        assert same == (epoch == best), (epoch, best)  # every epoch moved the weights, so only one matches


def test_schedule_warms_up_then_decays_to_zero():
    plan = Plan(100, FinetuneConfig(steps=10, warmup=2, batch_size=10), 1.0)
    rates = [plan.rate(s) for s in range(10)]
    assert rates[0] < rates[1] < rates[2] == 1.0
    assert all(a > b for a, b in zip(rates[2:], rates[3:])) and rates[-1] > 0
    assert default_lr(TINY["reference"]()) == 2e-4


def test_bad_inputs_are_refused():
    data = _data()
    with pytest.raises(UsageError, match="zero training steps"):
        finetune(TINY["reference"](), data, FinetuneConfig(steps=0))
    with pytest.raises(DataError, match="label 7"):
        finetune(TINY["reference"](), {**data, "labels": data["labels"] * 7}, FinetuneConfig(steps=1))
    with pytest.raises(UsageError, match="needs a teacher"):
        finetune(TINY["reference"](), data, FinetuneConfig(steps=1, kd_weight=0.5))
    with pytest.raises(NumericalError, match="step 1"):
        _nan_run(data)


def _nan_run(data):
    model = TINY["reference"]()
    with torch.no_grad():
        model.classifier.weight.fill_(math.nan)
    finetune(model, data, FinetuneConfig(steps=3))


def test_teacher_of_another_family_or_vocabulary_is_refused():
    import transformers as T

    student = TINY["bert"]()
    with pytest.raises(UsageError, match="same family"):
        check_compatible(TINY["distilbert"](), student)
    other = T.BertForSequenceClassification(
        T.BertConfig(
            vocab_size=VOCAB + 5,
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=48,
            num_labels=3,
        )
    )
    with pytest.raises(UsageError, match="vocabulary"):
        check_compatible(other, student)


def test_kd_gradient_matches_autograd():
    from headprune_cli.stages.training.distill import kd_logits

    s = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    t = torch.randn(4, 5, dtype=torch.float64)
    kd_logits(s, t, 2.0)[0].backward()
    ref = s.detach().clone().requires_grad_(True)
    log_s, log_t = torch.log_softmax(ref / 2, -1), torch.log_softmax(t / 2, -1)
    (4 * (log_t.exp() * (log_t - log_s)).sum()).backward()
    torch.testing.assert_close(s.grad.float(), ref.grad.float(), rtol=1e-5, atol=1e-6)


class _RankZeroOfTwo:
    """Rank 0 of a two-process run, without the process group: sums stay local."""

    rank, world, device, main, active = 0, 2, torch.device("cpu"), True, True

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def barrier(self) -> None:
        pass


def test_a_rank_backpropagates_its_rows_loss_sum_times_world_over_the_global_count(monkeypatch):
    """DDP and FSDP average gradients over processes, so each rank's backward carries world x
    (its rows' loss sum) / (the global count): averaged over 2 ranks, the global mean's gradient.
    Checked on rank 0 against cross-entropy written out here, on rows 0, 2, 4, ... of the batch."""
    from headprune_cli.stages.training import train as train_module

    monkeypatch.setattr(train_module, "_wrap", lambda model, ctx: model)  # no DDP without a process group
    model = TINY["reference"]()
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(2, 60, (6, 8), generator=gen)
    rows = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids[:, 0] % 2}
    cfg = FinetuneConfig(steps=1, batch_size=6)
    loop = train_module._Loop(
        model, rows, train_module.Plan(6, cfg, 1e-3), None, _RankZeroOfTwo(), None, 0.0, cfg, None, None
    )
    model.train()
    loop.micro_step(torch.arange(6), 6.0, 6.0)
    reference.train()
    mine = {k: v[0::2] for k, v in rows.items()}
    logits = reference(input_ids=mine["input_ids"], attention_mask=mine["attention_mask"]).logits
    (2 * torch.nn.functional.cross_entropy(logits, mine["labels"], reduction="sum") / 6.0).backward()
    expected = dict(reference.named_parameters())
    checked = 0
    for name, param in model.named_parameters():
        if expected[name].grad is None:
            assert param.grad is None or not param.grad.any(), name
            continue
        torch.testing.assert_close(param.grad, expected[name].grad, rtol=1e-5, atol=1e-8)
        checked += 1
    assert checked > 10
