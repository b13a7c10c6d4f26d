"""The output head in chunks of tokens: the same losses and gradients as whole logits, less kept."""

from __future__ import annotations

import pytest
import torch

from headprune_cli.data.readers import read_data
from headprune_cli.stages import lm_chunks
from headprune_cli.stages.objectives import next_token_mask, outputs_of, token_nll
from headprune_cli.stages.score.importance import score_model
from headprune_cli.stages.training.distill import kd_logits, soft_kl
from tests.support import TINY, give_tokenizer, write_text


@pytest.fixture
def lm(tmp_path):
    model = give_tokenizer(TINY["llama-gqa"](), encoder=False)
    data = read_data(write_text(tmp_path / "d.txt", 6), model)
    batch = {"input_ids": data.input_ids, "attention_mask": data.attention_mask}
    return model, data, batch


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 7 tokens: every batch here spans several, the last one short."""
    monkeypatch.setattr(lm_chunks, "CHUNKS_FROM", 7)
    monkeypatch.setattr(lm_chunks, "chunk_tokens", lambda vocab: 7)


def _grads(loss, model):
    return torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])


def test_chunked_nll_equals_whole_logits_with_the_same_gradients(lm, small_chunks):
    model, _, batch = lm
    nll, count = token_nll(outputs_of(model, batch), batch)
    whole = _grads((nll / count).sum(), model)
    with lm_chunks.head_off(model) as head:
        hidden = outputs_of(model, batch)
    assert hidden.shape[-1] == model.config.hidden_size  # the head was off
    chunked, chunk_count = lm_chunks.chunked_nll(head, hidden, batch)
    torch.testing.assert_close(chunked, nll, rtol=1e-6, atol=1e-6)
    assert torch.equal(chunk_count, count)
    for a, b in zip(_grads((chunked / chunk_count).sum(), model), whole):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert model.get_output_embeddings() is head  # restored


def test_chunked_distillation_equals_whole_logits_with_the_same_gradients(lm, small_chunks):
    model, _, batch = lm
    teacher = give_tokenizer(TINY["llama-gqa"](), encoder=False)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a teacher that differs from the student
        for p in teacher.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    mask = next_token_mask(batch)
    with torch.no_grad():
        ref = outputs_of(teacher, batch)
    whole_loss = kd_logits(outputs_of(model, batch)[:, :-1], ref[:, :-1], 2.0, mask)[0]
    whole = _grads(whole_loss, model)
    with lm_chunks.head_off(model) as head, lm_chunks.head_off(teacher) as teacher_head:
        hidden = outputs_of(model, batch)
        with torch.no_grad():
            teacher_hidden = outputs_of(teacher, batch)
    loss = lm_chunks.chunked_kd(head, hidden, teacher_head, teacher_hidden, 2.0, mask, soft_kl)
    torch.testing.assert_close(loss, whole_loss, rtol=1e-6, atol=1e-6)
    for a, b in zip(_grads(loss, model), whole):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_chunks_keep_no_logits_for_the_backward(lm, small_chunks):
    """Whole logits keep [tokens, vocab] floats for the backward; chunks keep hidden states and
    compute one chunk's logits again in the backward."""
    model, _, batch = lm
    vocab = model.config.vocab_size

    def logits_kept(chunked: bool) -> int:
        sizes = []

        def pack(t):
            logits = vocab in t.shape and not isinstance(t, torch.nn.Parameter)  # the head's weight is not
            sizes.append(t.numel() if logits else 0)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if chunked:
                with lm_chunks.head_off(model) as head:
                    loss = lm_chunks.chunked_nll(head, outputs_of(model, batch), batch)[0].sum()
            else:
                loss = token_nll(outputs_of(model, batch), batch)[0].sum()
        torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
        return sum(sizes)

    predicted = batch["input_ids"].numel() - len(batch["input_ids"])
    assert logits_kept(False) >= predicted * vocab  # the whole batch's logits
    assert logits_kept(True) == 0


def test_scores_from_chunks_and_row_pieces_match_whole_batches(lm, monkeypatch):
    model, data, _ = lm
    whole = score_model(model, data, "fisher", batch_size=6, ffn=True, recompute=False)
    monkeypatch.setattr(lm_chunks, "CHUNKS_FROM", 7)
    monkeypatch.setattr(lm_chunks, "chunk_tokens", lambda vocab: 7)
    monkeypatch.setattr("headprune_cli.stages.score.importance.api.tokens_per_pass", lambda model, recompute: 1)
    pieces = score_model(model, data, "fisher", batch_size=6, ffn=True, recompute=False)
    assert pieces.heads.keys() == whole.heads.keys()
    for layer in whole.heads:
        assert pieces.heads[layer] == pytest.approx(whole.heads[layer], rel=1e-5)
        assert pieces.ffn[layer] == pytest.approx(whole.ffn[layer], rel=1e-5)


def test_chunks_only_for_plain_linear_heads_of_causal_lms(lm):
    model, _, batch = lm
    assert lm_chunks.head_name(model) == "lm_head"
    assert not lm_chunks.wants_chunks(model, batch)  # a tiny batch takes the plain path
    model.config.final_logit_softcapping = 30.0  # Gemma 2's capped logits are more than the head
    assert lm_chunks.head_name(model) is None
    encoder = give_tokenizer(TINY["bert"](), encoder=True)
    assert lm_chunks.head_name(encoder) is None


@pytest.mark.parametrize("kd", [0.5, 1.0])
def test_lora_distillation_in_chunks_trains_the_same_weights(kd, monkeypatch):
    """finetune --lora --teacher: chunked logits give the weights whole logits give."""
    from headprune_cli.model.surgery import apply_plan
    from headprune_cli.stages.options import LoraSpec
    from headprune_cli.stages.training.lora import attach
    from headprune_cli.stages.training.train import FinetuneConfig, finetune

    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(2, 60, (16, 8), generator=gen)
    data = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    results = []
    for chunked in (False, True):
        if chunked:
            monkeypatch.setattr(lm_chunks, "CHUNKS_FROM", 7)
            monkeypatch.setattr(lm_chunks, "chunk_tokens", lambda vocab: 7)
        teacher = TINY["llama-gqa"]()
        model = TINY["llama-gqa"]()
        apply_plan(model, {0: [0, 1, 2, 3]}, [])
        attach(model, LoraSpec(rank=2), seed=0)
        cfg = FinetuneConfig(steps=3, lr=1e-2, batch_size=8, warmup=0, kd_weight=kd)
        result = finetune(model, data, cfg, teacher=teacher)
        results.append({k: v.detach().clone() for k, v in result.model.state_dict().items()})
    assert lm_chunks.wants_chunks(model, data)  # the second run took the chunked path
    for name, value in results[0].items():
        torch.testing.assert_close(results[1][name], value, rtol=1e-5, atol=1e-6)
