"""The copy tasks of ``scripts/train_tiny_es.py --copy``: seeded, built from the training split
only, stitched from short pieces (no document boundary inside a piece), with no loss on the
source passages and loss on the copies; the held-out copy prompts and their metric."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import train_tiny_es as train  # noqa: E402

from ai_evolution.model.tokenizer import load_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def split():
    tok = load_tokenizer("tiny-es")
    docs, _ = train.read_corpus(train.DEFAULT_CORPUS)
    train_ids, val = train.split_tokens(tok, docs, 0.05)
    return tok, train_ids, val


def test_tasks_are_seeded_and_weigh_only_what_copies(split):
    tok, train_ids, _ = split
    rows = [train.CopyTasks(tok, train_ids, seed=0).row(400) for _ in range(2)]
    assert torch.equal(rows[0][0], rows[1][0]) and torch.equal(rows[0][1], rows[1][1])
    assert rows[0][2] == rows[1][2] and rows[0][2]
    ids = rows[0][0].tolist()
    for q, k in rows[0][2]:  # an induction link: same previous token, the next token copied
        assert q < 399 and k <= q and ids[q] == ids[k - 1] and ids[q + 1] == ids[k]
    other = train.CopyTasks(tok, train_ids, seed=1).row(400)[0]
    assert not torch.equal(rows[0][0], other)
    tasks = train.CopyTasks(tok, train_ids, seed=0)
    seen = set()
    for _ in range(40):
        ids, weight, links = tasks.task()
        assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id and len(ids) == len(weight)
        assert set(weight) == {0, 1}
        text = tok.decode(ids[1:-1])
        kind = ("repite" if text.startswith("Repite: ") else "corrige" if text.startswith("Corrige: ")
                else "cita" if "Pregunta: ¿Cómo empieza el texto?" in text else "copia")
        seen.add(kind)
        source = [t for t, w in zip(ids, weight) if w == 0]
        copied = ids[len(ids) - 1 - len(source):-1]
        if kind in ("copia", "repite"):
            assert copied == source  # the last copy is the passage the loss never saw
            assert len(links) >= len(source) - 1
            assert train.COPY_PASSAGE[0] <= len(source) <= train.COPY_PASSAGE[1]
        if kind == "cita":
            half = source[:len(source) // 2]
            assert ids[-1 - len(tok.encode("»", add_bos=False)) - len(half):-1 - len(tok.encode("»", add_bos=False))] == half
    assert seen == set(train.CopyTasks.KINDS)


def test_passages_come_from_the_training_split_in_pieces_without_boundaries(split):
    tok, train_ids, _ = split
    tasks = train.CopyTasks(tok, train_ids, seed=0)
    text = train_ids.tolist()
    specials = {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}
    for _ in range(20):
        n = tasks._int(*train.COPY_PIECE)
        piece = tasks.piece(n)
        assert len(piece) == n and not specials.intersection(piece)
        assert any(text[i:i + n] == piece for i in range(len(text) - n + 1))


def test_held_out_copy_prompts_ask_for_the_rest_of_each_passage(split):
    tok, _, val = split
    sep = tok.encode("\n\n", add_bos=False)
    prompts, expected = train.copy_prompts(val, sep)
    assert len(prompts) == sum(len(v) >= train.COPY_EVAL_PASSAGE for v in val) > 0
    for prompt, want, v in zip(prompts, expected, val):
        passage = v[:train.COPY_EVAL_PASSAGE].tolist()
        assert prompt == passage + sep + passage[:train.COPY_CUE]
        assert want == passage[train.COPY_CUE:]


def test_kinds_and_piece_lengths_are_chosen(split):
    tok, train_ids, _ = split
    tasks = train.CopyTasks(tok, train_ids, seed=0, kinds=("copia",), piece=(1, 1))
    for _ in range(10):
        ids, weight, _ = tasks.task()
        text = tok.decode(ids[1:-1])
        assert not text.startswith(("Repite: ", "Corrige: ")) and "Pregunta:" not in text
    assert tasks.piece_len == (1, 1)
    words = [tasks.passage() for _ in range(5)]
    assert all(train.COPY_PASSAGE[0] <= len(w) <= train.COPY_PASSAGE[1] for w in words)


def test_tasks_without_bos_keep_their_links(split):
    tok, train_ids, _ = split
    tasks = train.CopyTasks(tok, train_ids, seed=0, bos_share=0.5)
    starts = set()
    for _ in range(30):
        ids, weight, links = tasks.task()
        starts.add(ids[0] == tok.bos_token_id)
        assert len(ids) == len(weight) and ids[-1] == tok.eos_token_id
        for q, k in links:
            assert 0 <= k - 1 and ids[q] == ids[k - 1] and ids[q + 1] == ids[k]
    assert starts == {True, False}
    never = train.CopyTasks(tok, train_ids, seed=0, bos_share=0.0)
    assert all(never.task()[0][0] != tok.bos_token_id for _ in range(10))


@pytest.mark.parametrize("argv, message", [
    (["--copy", "--copy-bos-share", "1.5"], "[0, 1]"),
    (["--copy", "--induction-heads", "2", "0", "5"], "LAYER HEAD pairs"),
    (["--copy", "--copy-piece", "0", "3"], "1 <= MIN <= MAX"),
    (["--copy", "--copy-piece", "4", "3"], "1 <= MIN <= MAX"),
    (["--copy", "--max-val-ratio", "-1"], ">= 0"),
])
def test_bad_copy_flags_are_refused_with_the_accepted_values(argv, message, capsys):
    with pytest.raises(SystemExit):
        train.parse_args(argv)
    assert message in capsys.readouterr().err


def test_copy_flags_are_parsed_into_head_pairs():
    args = train.parse_args(["--copy", "--induction-heads", "5", "2", "2", "0", "5", "2"])
    assert args.induction_heads == [(2, 0), (5, 2)]
    assert train.parse_args(["--copy"]).induction_heads == [tuple(train.COPY_DEFAULTS["induction_heads"][:2])]


def tiny_model():
    from ai_evolution.model import ModelConfig
    from ai_evolution.model.checkpoint import random_model

    config = ModelConfig(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                         intermediate_size=96, vocab_size=97, max_position_embeddings=64)
    return random_model(config, seed=0)


def test_probes_stack_supervise_several_heads_and_come_off_in_order():
    model = tiny_model()
    ids = torch.randint(3, 97, (2, 20), generator=torch.Generator().manual_seed(0))
    ids[1, 12:15] = ids[1, 4:7]
    with torch.no_grad():
        plain = model(ids)
    model.train()
    import ai_evolution.model.decoder as decoder
    original = decoder.causal_attention
    induction = train.InductionProbe(model, 1, [0, 2], scale="final")
    prev = train.PreviousTokenProbe(model, 0, [1])
    try:
        assert torch.allclose(model(ids), plain, atol=1e-5)
        assert induction.probs.shape == (2, 2, 20, 20) and prev.probs.shape == (2, 1, 20, 20)
        assert induction.final_rms.shape == (2, 20, 1)
        links = [[], [(12, 5), (13, 6)]]
        loss_i, loss_p = induction.loss(ids, links), prev.loss(ids, links)
        assert loss_i.isfinite() and loss_i > 0 and loss_p.isfinite() and loss_p > 0
        (loss_i + loss_p).backward()
        assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    finally:
        prev.remove()
        induction.remove()
    assert decoder.causal_attention is original


def test_the_induction_probe_keeps_the_forward_and_supervises_one_head():
    model = tiny_model()
    ids = torch.randint(3, 97, (2, 20), generator=torch.Generator().manual_seed(0))
    ids[1, 12:15] = ids[1, 4:7]  # a copy: query 12 should look at key 5, query 13 at key 6
    with torch.no_grad():
        plain = model(ids)
    model.train()
    probe = train.InductionProbe(model, 1, [2])
    try:
        logits = model(ids)
        assert torch.allclose(logits, plain, atol=1e-5)  # the explicit attention is the same one
        assert probe.probs.shape == (2, 1, 20, 20)
        assert torch.allclose(probe.probs.sum(-1), torch.ones(2, 1, 20))
        assert probe.probs.triu(1).abs().max() == 0  # causal
        links = [[], [(12, 5), (13, 6)]]
        loss = probe.loss(ids, links)
        assert loss.isfinite() and loss > 0
        loss.backward()
        assert model.model.layers[1].self_attn.q_proj.weight.grad.abs().sum() > 0
        assert probe.loss(ids, [[], []]) is None
        model.eval()
        with torch.no_grad():
            probe.probs = None
            model(ids)
        assert probe.probs is None  # only training forwards are probed
    finally:
        probe.remove()
    import ai_evolution.model.decoder as decoder
    assert decoder.causal_attention is probe.original
