"""The served model of labs 2 and 6 (``labs.common.load_served_model``), offline: a Hub id whose
checkpoint cannot be had falls back to the shipped ``tiny-es`` with a Spanish warning and a
sentence in the contract's limitations (a silent fallback fails here); a checkpoint in the Hub
cache layout is served by its id, with its tokenizer, its special tokens and its chat template,
which the server uses. huggingface_hub reads its environment when imported, so the fixtures set
both the environment and its ``constants``."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import httpx
import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer

from ai_evolution.labs import get_spec, run_lab
from ai_evolution.labs.common import (FALLBACK_MODEL, GPU_TEXT_MODEL, ServedModelFallback,
                                      load_served_model)
from ai_evolution.model import get_preset, load_tokenizer, random_model, save_pretrained, shipped_model_dir
from ai_evolution.server.chat_template import apply_chat_template

hub_constants = pytest.importorskip("huggingface_hub.constants")

COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
REPO = "acme/tiny-chat"
# The lab's fast `ci` run (tests/test_lab_kv_cache.py): a few seconds.
FAST = dict(max_new_tokens=24, repeats=2, exactness_tokens=6, batch_size=2)
# A ChatML template as Qwen2.5-Instruct's tokenizer_config.json ships it (shortened), with a
# raise_exception like the ones real templates use to refuse a conversation.
CHATML = (
    "{%- if messages[-1]['role'] == 'assistant' %}"
    "{{ raise_exception('the last message must not be from the assistant') }}{%- endif %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'system' and loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n")


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    """A Hub cache holding ``acme/tiny-chat`` as a download leaves it: a 1-layer model, the
    tiny-es tokenizer plus ChatML's two special tokens, and a tokenizer_config.json that declares
    no BOS, ``<|im_end|>`` as EOS and the chat template."""
    cache = tmp_path_factory.mktemp("hub")
    repo = cache / "models--acme--tiny-chat"
    snapshot = repo / "snapshots" / COMMIT
    backend = HFTokenizer.from_file(str(shipped_model_dir("tiny-es") / "tokenizer.json"))
    backend.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    vocab = backend.get_vocab_size(with_added_tokens=True)
    config = get_preset("tiny-es").replace(num_layers=1, vocab_size=vocab, eos_token_id=vocab - 1,
                                           name="tiny-chat")
    save_pretrained(random_model(config, seed=5), snapshot)
    backend.save(str(snapshot / "tokenizer.json"))
    (snapshot / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
         "chat_template": CHATML}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return cache


def offline(monkeypatch, cache: Path) -> None:
    monkeypatch.setenv("HF_HOME", str(cache.parent / "hf_home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def empty_offline_hub(monkeypatch, tmp_path):
    cache = tmp_path / "hub"
    cache.mkdir()
    offline(monkeypatch, cache)


@pytest.fixture
def offline_hub(monkeypatch, hub_cache):
    offline(monkeypatch, hub_cache)


def test_the_gpu_profile_serves_a_real_checkpoint_and_the_others_keep_their_defaults():
    for kind in ("kv_cache", "observability"):
        param = get_spec(kind).params["model"]
        assert param.default_for("gpu") == GPU_TEXT_MODEL == "Qwen/Qwen2.5-0.5B-Instruct"
        assert param.default_for("ci") == param.default_for("cpu") == "tiny-es"
        assert GPU_TEXT_MODEL in param.choices and "smollm2-135m" in param.choices
    # the labs where only the shapes matter keep their random-weight presets
    assert GPU_TEXT_MODEL not in get_spec("continuous_batching").params["model"].choices


def test_a_missing_checkpoint_falls_back_to_tiny_es_with_a_spanish_warning(empty_offline_hub):
    with pytest.warns(ServedModelFallback) as caught:
        served = load_served_model(GPU_TEXT_MODEL, seed=0)
    message = str(caught[0].message)
    assert f"El modelo '{GPU_TEXT_MODEL}' no está disponible" in message
    assert "no se pudo obtener" in message  # the reason, from model.hub
    assert f"sigue con el modelo incluido '{FALLBACK_MODEL}'" in message
    assert served.fell_back and served.name == "tiny-es" and served.requested == GPU_TEXT_MODEL
    assert served.tokenizer is not None and served.tokenizer.name == "tiny-es"
    (sentence,) = served.limitations()
    assert sentence.startswith(f"Se pidió el modelo {GPU_TEXT_MODEL} y no se sirvió (motivo: no se pudo obtener")
    assert f"no de {GPU_TEXT_MODEL}" in sentence and "tiny-es" in sentence


def test_the_kv_cache_contract_never_claims_the_model_it_could_not_serve(empty_offline_hub):
    with pytest.warns(ServedModelFallback, match="Qwen2.5-0.5B-Instruct"):
        contract = run_lab("kv_cache", seed=3, profile="ci", model=GPU_TEXT_MODEL, **FAST)
    assert contract["params"]["model"] == GPU_TEXT_MODEL
    env = contract["environment"]
    assert env["model"] == contract["results"]["model"]["name"] == "tiny-es"
    assert env["model_requested"] == GPU_TEXT_MODEL and "no se pudo obtener" in env["model_fallback_reason"]
    first = contract["limitations"][0]
    assert GPU_TEXT_MODEL in first and "todas las mediciones son del modelo incluido tiny-es" in first


def test_a_checkpoint_in_the_hub_cache_is_served_by_its_id_without_fallback(offline_hub):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ServedModelFallback)
        served = load_served_model(REPO, seed=0)
    assert not served.fell_back and served.limitations() == []
    assert served.name == REPO and served.model.config.num_layers == 1  # not the snapshot's hash
    assert served.tokenizer.name == REPO and served.environment()["model_fallback_reason"] is None
    spec = get_spec("kv_cache")
    params = {**spec.resolve_params("ci", FAST), "model": REPO}  # run() serves any Hub id
    body = spec.run(seed=3, profile="ci", params=params, device=torch.device("cpu"))
    assert body["environment"]["model"] == body["results"]["model"]["name"] == REPO
    assert not any("Se pidió el modelo" in s for s in body["limitations"])
    assert body["results"]["exactness"]["identical_greedy_tokens"] is True


def test_a_hub_tokenizer_brings_its_special_tokens_and_chat_template(offline_hub):
    tok = load_tokenizer(REPO)
    im_start, im_end = tok.encode("<|im_start|>"), tok.encode("<|im_end|>")
    assert len(im_start) == len(im_end) == 1 and tok.eos_token_id == im_end[0]
    assert tok.bos_token_id is None and tok.encode("Hola", add_bos=True) == tok.encode("Hola")
    ids = apply_chat_template(tok, [("developer", "Sea breve."), ("user", "¿Qué es la caché KV?")])
    text = ("<|im_start|>system\nSea breve.<|im_end|>\n<|im_start|>user\n¿Qué es la caché KV?"
            "<|im_end|>\n<|im_start|>assistant\n")
    assert ids == tok.encode(text) and ids[0] == im_start[0]
    shipped = load_tokenizer("tiny-es")  # no template: the shipped convention, BOS first
    assert shipped.chat_template is None
    assert apply_chat_template(shipped, [("user", "Hola")]) == shipped.encode("Usuario: Hola\nAsistente:",
                                                                               add_bos=True)


def test_the_server_renders_the_chat_template_and_serves_under_the_hub_id(offline_hub):
    from ai_evolution.engine import LLM
    from ai_evolution.server.launch import serve_in_thread

    llm = LLM(REPO, max_model_len=128, max_num_seqs=2)
    expected = apply_chat_template(llm.tokenizer, [("user", "Hola")])
    with serve_in_thread(llm) as server:
        assert server.model_name == REPO
        ok = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60, json={
            "model": REPO, "max_tokens": 3, "messages": [{"role": "user", "content": "Hola"}]})
        refused = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60, json={
            "model": REPO, "max_tokens": 3,
            "messages": [{"role": "user", "content": "Hola"}, {"role": "assistant", "content": "Hola"}]})
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["prompt_tokens"] == len(expected)
    assert refused.status_code == 400
    assert "the last message must not be from the assistant" in refused.json()["error"]["message"]


def test_an_unreadable_checkpoint_falls_back_too(offline_hub, hub_cache, tmp_path, monkeypatch):
    broken = tmp_path / "hub"
    shutil.copytree(hub_cache, broken)
    snapshot = broken / "models--acme--tiny-chat" / "snapshots" / COMMIT
    (snapshot / "model.safetensors").write_bytes(b"not safetensors")
    offline(monkeypatch, broken)
    with pytest.warns(ServedModelFallback, match="no se puede leer el archivo safetensors"):
        served = load_served_model(REPO)
    assert served.fell_back and served.name == "tiny-es"


def test_lab_7_measures_quality_on_the_real_checkpoint_in_the_gpu_profile():
    param = get_spec("quantization").params["quality_model"]
    assert param.default_for("gpu") == GPU_TEXT_MODEL
    assert param.default_for("ci") == param.default_for("cpu") == "tiny-es"


def test_lab_7_scores_a_hub_checkpoint_on_tiny_es_held_out_text(offline_hub):
    from ai_evolution.labs import quantization
    from ai_evolution.model.shipped_models import held_out_tokens

    model, chunks, served = quantization.quality_text(REPO)
    assert served == {"model": REPO, "model_requested": REPO, "model_fallback_reason": None}
    shipped = load_tokenizer("tiny-es")
    texts = [shipped.decode(c) for c in held_out_tokens("tiny-es")]
    tokenizer = load_tokenizer(REPO)
    assert [tokenizer.decode(c) for c in chunks] == texts  # the same text, in its own tokens
    assert all(max(c) < model.config.vocab_size for c in chunks)


def test_lab_7_says_when_its_quality_model_fell_back(empty_offline_hub):
    from types import SimpleNamespace

    from ai_evolution.labs import quantization

    with pytest.warns(ServedModelFallback):
        model, chunks, served = quantization.quality_text(GPU_TEXT_MODEL)
    assert served["model"] == "tiny-es" and served["model_fallback_reason"]
    quality = {"model": "tiny-es", "served": served, "parameters": 5.0e6, "held_out_tokens": 10,
               "chunks": 2}
    f = SimpleNamespace(speed={"model": "cpu-200m", "device": "cpu", "repeats": 5,
                               "torch_threads": 1},
                        quality=quality, kv={"model": "tiny-es"}, params={"torch_threads": 1})
    said = quantization._limitations(f)
    assert any(s.startswith(f"La calidad se pidió en {GPU_TEXT_MODEL} y se midió en tiny-es "
                            "(motivo: no se pudo obtener") for s in said)
    assert "Todo se midió con 1 hilo de torch (parámetro torch_threads)." in said
