"""The tokenizer wrapper and the shipped ``tiny-es`` model: round-trips, offline loading, size,
and generation that reads as Spanish (which random weights fail)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from ai_evolution.generation import generate
from ai_evolution.model import param_count
from ai_evolution.model.checkpoint import load_pretrained, random_model
from ai_evolution.model.tokenizer import Tokenizer, load_tokenizer

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "ai_evolution" / "model" / "shipped" / "tiny-es"
CORPUS = REPO / "data" / "corpus"
MAX_BYTES = 20 * 1024 * 1024

TRICKY = [
    "",
    "La caché KV guarda las claves y los valores.",
    "¿Qué es un token? ¡Una pieza de texto!",
    "Año, niño, pingüino, cigüeña: ÑANDÚ Á É Í Ó Ú ü",
    "3,35 TB/s y 131 072 bytes por token (2 × 32 × 8 × 128 × 2).",
    "línea uno\nlínea dos\r\n\n\ttabulada   con  espacios  ",
    "—Dijo Lucía—. «Comillas» y emoji 🙂🚀, chino 模型, árabe نموذج.",
    " espacio inicial y final ",
]

WORD = re.compile(r"[a-záéíóúüñ]+")


def _words(text: str) -> list[str]:
    return WORD.findall(text.lower())


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load_tokenizer("tiny-es")


@pytest.fixture(scope="module")
def model():
    return load_pretrained("tiny-es")


@pytest.fixture(scope="module")
def corpus_words() -> tuple[set[str], set[tuple[str, str]]]:
    words: set[str] = set()
    bigrams: set[tuple[str, str]] = set()
    for f in sorted(CORPUS.glob("*.txt")):
        w = _words(f.read_text(encoding="utf-8"))
        words.update(w)
        bigrams.update(zip(w, w[1:]))
    return words, bigrams


def spanish_scores(text: str, corpus_words) -> tuple[float, float, int]:
    """(fraction of words in the corpus vocabulary, fraction of word bigrams seen in the corpus,
    number of words). Bigrams catch degenerate output such as one corpus word repeated."""
    vocab, bigrams = corpus_words
    w = _words(text)
    if len(w) < 2:
        return 0.0, 0.0, len(w)
    in_vocab = sum(x in vocab for x in w) / len(w)
    pairs = list(zip(w, w[1:]))
    in_bigrams = sum(p in bigrams for p in pairs) / len(pairs)
    return in_vocab, in_bigrams, len(w)


# --- tokenizer -----------------------------------------------------------------------------------
@pytest.mark.parametrize("text", TRICKY)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == text


def test_special_tokens(tok):
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2)
    ids = tok.encode("Hola", add_bos=True)
    assert ids[0] == tok.bos_token_id and ids[1:] == tok.encode("Hola")
    assert tok.decode(ids + [tok.eos_token_id]) == "Hola"
    assert tok.decode(ids, skip_special_tokens=False) == "<s>Hola"


def test_frequent_words_are_single_tokens(tok):
    # The tokenizer was trained on the course corpus: its key words are one token each.
    for word in (" caché", " modelo", " memoria", " tokens"):
        assert len(tok.encode(word)) == 1, word


def test_load_tokenizer_from_paths(tok):
    by_dir = load_tokenizer(SHIPPED)
    by_file = load_tokenizer(SHIPPED / "tokenizer.json")
    by_cls = Tokenizer.from_file(SHIPPED / "tokenizer.json")
    text = "El prefill procesa el mensaje de una vez."
    assert by_dir.encode(text) == by_file.encode(text) == by_cls.encode(text) == tok.encode(text)
    assert by_dir.vocab_size == tok.vocab_size


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(ValueError, match="tiny-es"):
        load_tokenizer("no-such-model")
    missing = tmp_path / "nowhere" / "tokenizer.json"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        load_tokenizer(missing)
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "tokenizer.json"))):
        load_tokenizer(tmp_path)  # a folder without tokenizer.json
    with pytest.raises(FileNotFoundError, match="nope.json"):
        Tokenizer.from_file(tmp_path / "nope.json")


# --- shipped model -------------------------------------------------------------------------------
def test_shipped_files_and_size():
    for name in ("config.json", "model.safetensors", "tokenizer.json", "training.json", "README.md"):
        assert (SHIPPED / name).is_file(), name
    assert (SHIPPED / "model.safetensors").stat().st_size <= MAX_BYTES


def test_load_pretrained_offline(model, tok):
    config = model.config
    assert model.num_parameters() == param_count(config)
    assert config.vocab_size == tok.vocab_size
    assert config.num_kv_heads < config.num_heads  # grouped-query attention
    assert config.bos_token_id == tok.bos_token_id and config.eos_token_id == tok.eos_token_id
    assert next(model.parameters()).dtype.is_floating_point
    assert str(next(model.parameters()).dtype) == "torch.float32"
    training = json.loads((SHIPPED / "training.json").read_text())
    assert training["parameters"] == model.num_parameters()
    assert training["weights"]["safetensors_bytes"] == (SHIPPED / "model.safetensors").stat().st_size


def test_unknown_shipped_model_names_the_shipped_ones():
    with pytest.raises(FileNotFoundError, match="tiny-es"):
        load_pretrained("no-such-model")


def test_validation_loss_beats_uniform_guessing(tok):
    training = json.loads((SHIPPED / "training.json").read_text())
    res = training["results"]
    uniform = math.log(tok.vocab_size)
    assert abs(res["uniform_loss"] - uniform) < 1e-3
    # Held-out perplexity at least 5x better than guessing uniformly among the vocabulary.
    for key in ("final_val_loss", "shipped_weights_val_loss"):
        assert res[key] < uniform - math.log(5), (key, res[key], uniform)
    assert res["final_train_loss"] < res["final_val_loss"]
    assert math.isclose(res["final_val_perplexity"], math.exp(res["final_val_loss"]), rel_tol=1e-3)


@pytest.mark.parametrize("prompt", ["La caché KV", "Un modelo de lenguaje"])
def test_greedy_generation_reads_as_spanish(model, tok, corpus_words, prompt):
    new = generate(model, tok.encode(prompt, add_bos=True), max_new_tokens=32,
                   temperature=0.0, eos_token_id=tok.eos_token_id)[0]
    text = tok.decode(new)
    in_vocab, in_bigrams, n = spanish_scores(text, corpus_words)
    assert n >= 8, text
    assert in_vocab >= 0.5 and in_bigrams >= 0.5, (prompt, text, in_vocab, in_bigrams)


def test_random_weights_fail_the_spanish_check(model, tok, corpus_words):
    # The same check rejects an untrained model, so passing it says something about the weights.
    rand = random_model(model.config, seed=0)
    for prompt in ("La caché KV", "Un modelo de lenguaje"):
        new = generate(rand, tok.encode(prompt, add_bos=True), max_new_tokens=32,
                       temperature=0.0, eos_token_id=tok.eos_token_id)[0]
        in_vocab, in_bigrams, n = spanish_scores(tok.decode(new), corpus_words)
        assert n < 8 or in_vocab < 0.5 or in_bigrams < 0.5, (prompt, tok.decode(new))
