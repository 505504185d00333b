"""Checkpoints by Hugging Face Hub id, offline: a small model saved in the Hub cache layout loads
by its id with ``HF_HUB_OFFLINE=1`` (weights, tokenizer, and through ``LLM``), and an id that is
not in the cache fails with a Spanish message that says what to do. Each case runs in a fresh
interpreter: huggingface_hub reads its environment when imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ai_evolution.model import get_preset, random_model, save_pretrained, shipped_model_dir
from ai_evolution.model.hub import looks_like_hub_id

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    """A Hub cache holding ``acme/tiny-test`` (refs/main -> one snapshot), as a download leaves it."""
    cache = tmp_path_factory.mktemp("hub")
    repo = cache / "models--acme--tiny-test"
    snapshot = repo / "snapshots" / COMMIT
    config = get_preset("tiny-es").replace(num_layers=1, name="tiny-test")
    save_pretrained(random_model(config, seed=3), snapshot)
    shutil.copyfile(shipped_model_dir("tiny-es") / "tokenizer.json", snapshot / "tokenizer.json")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return cache


def run_offline(cache: Path, code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)


def test_a_model_in_the_hub_cache_loads_by_id_offline(hub_cache):
    done = run_offline(hub_cache, """
import json, torch
from ai_evolution.engine import LLM, SamplingParams
from ai_evolution.model import load_pretrained, load_tokenizer, random_model, get_preset
m = load_pretrained("acme/tiny-test")
ref = random_model(get_preset("tiny-es").replace(num_layers=1, name="tiny-test"), seed=3)
same = all(torch.equal(a, b.to(a.dtype)) for a, b in zip(m.state_dict().values(), ref.state_dict().values()))
tok = load_tokenizer("acme/tiny-test")
out = LLM("acme/tiny-test", max_model_len=64).generate(["Hola"], SamplingParams(max_tokens=3, ignore_eos=True))
print(json.dumps({"layers": m.config.num_layers, "same": same, "vocab": tok.vocab_size,
                  "tokens": len(out[0].token_ids), "text": out[0].text is not None}))
""")
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"layers": 1, "same": True, "vocab": 4054, "tokens": 3, "text": True}


def test_an_id_missing_from_the_cache_offline_fails_in_spanish(hub_cache):
    done = run_offline(hub_cache, """
from ai_evolution.model import load_pretrained
from ai_evolution.model.hub import HubUnavailable
try:
    load_pretrained("acme/not-there")
except HubUnavailable as err:
    print("ERR", err)
""")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ERR" in done.stdout and "no se pudo obtener 'acme/not-there'" in done.stdout
    assert "caché del Hub" in done.stdout and "carpeta local" in done.stdout


def test_hub_ids_are_told_apart_from_paths_and_shipped_names(tmp_path):
    assert looks_like_hub_id("Qwen/Qwen2.5-0.5B-Instruct")
    assert not looks_like_hub_id("tiny-es") and not looks_like_hub_id("./a/b")
    assert not looks_like_hub_id("a/b/c") and not looks_like_hub_id("/abs/path")
    local = tmp_path / "org" / "name"
    local.mkdir(parents=True)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert not looks_like_hub_id("org/name")  # an existing folder is a folder
    finally:
        os.chdir(cwd)
