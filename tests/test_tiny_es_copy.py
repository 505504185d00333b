"""The shipped copying model ``tiny-es-copy``: it loads by name with tiny-es's tokenizer and
architecture, it repeats a held-out paragraph when asked (a property of the shipped weights, which
tiny-es does not have), and n-gram speculation on it gives exactly its plain greedy tokens while
keeping most of its proposals."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ai_evolution.engine import SamplingParams, build_engine
from ai_evolution.labs.speculative import COPIES as LAB_COPIES, copy_rate, measure_copy_rate, ngram_workloads
from ai_evolution.model import get_preset, load_model
from ai_evolution.model.checkpoint import load_pretrained
from ai_evolution.model.shipped_models import held_out_tokens, shipped_model_dir, shipped_names
from ai_evolution.model.tokenizer import load_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

PASSAGE, NEW = 40, 32  # the lab's paragraph length and the tokens after its 8-token cue
# Held-out paragraphs the copying model must reproduce in place at least this well, and tiny-es
# at most this well (training.json records the measured fractions on all 24 held-out files).
COPIES, DOES_NOT_COPY = LAB_COPIES, 0.2  # the lab's own line between copying and not


@pytest.fixture(scope="module")
def copier():
    return load_pretrained("tiny-es-copy")


@pytest.fixture(scope="module")
def copy_load():
    sep = load_tokenizer("tiny-es-copy").encode("\n\n", add_bos=False)
    return ngram_workloads("tiny-es-copy", 8, PASSAGE, sep)["copia"]


def test_it_ships_with_the_tokenizer_and_architecture_of_tiny_es(tiny, copier):
    assert "tiny-es-copy" in shipped_names()
    folder = shipped_model_dir("tiny-es-copy")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "training.json",
                 "README.md", "held_out.json"):
        assert (folder / name).is_file(), name
    tiny_dir = shipped_model_dir("tiny-es")
    assert (folder / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    assert held_out_tokens("tiny-es-copy") == held_out_tokens("tiny-es")
    assert copier.config.name == "tiny-es-copy"
    assert dataclasses.replace(copier.config, name="tiny-es") == tiny.config
    assert copier.num_parameters() == tiny.num_parameters()
    assert load_model("tiny-es-copy").config == copier.config
    assert get_preset("tiny-es-copy").num_layers == tiny.config.num_layers
    record = json.loads((folder / "training.json").read_text())
    assert record["model"] == "tiny-es-copy"
    first, second = record["stages"]  # stage 1 from tiny-es's weights, stage 2 from stage 1's
    assert first["init"].endswith("ai_evolution/model/shipped/tiny-es")
    assert "--init-from" in second["command"] and second["command"] == record["command"]
    copied = record["copy"]["held_out_copy"]
    assert copied["copy_fraction"] >= COPIES > DOES_NOT_COPY >= copied["copy_fraction_init"]


def test_it_repeats_a_held_out_paragraph_and_tiny_es_does_not(tiny, copier, copy_load):
    assert measure_copy_rate(copier, copy_load, NEW) >= COPIES
    assert measure_copy_rate(tiny, copy_load, NEW) <= DOES_NOT_COPY


@pytest.mark.parametrize("batch", [1, 4])
def test_ngram_speculation_on_it_is_exact_and_keeps_most_proposals(copier, copy_load, batch):
    sp = SamplingParams(max_tokens=NEW, ignore_eos=True)
    items = [(0.0, p, sp) for p in copy_load["prompts"]]
    outputs, engines = {}, {}
    for name, spec in (("plain", None), ("ngram", {"method": "ngram", "num_speculative_tokens": 4,
                                                    "prompt_lookup_min": 1, "prompt_lookup_max": 3})):
        engines[name] = build_engine(copier, max_num_seqs=batch, max_model_len=160,
                                     kv_layout="paged", speculative_config=spec)
        reqs = engines[name].run(items)
        outputs[name] = [r.output_token_ids for r in reqs]
        if name == "ngram":
            drafted = sum(r.num_draft_tokens for r in reqs)
            accepted = sum(r.num_accepted_tokens for r in reqs)
    assert outputs["ngram"] == outputs["plain"]
    assert copy_rate(outputs["plain"], copy_load["expected"]) >= COPIES
    assert accepted > 0.5 * drafted > 0
    assert len(engines["ngram"].history) < 0.6 * len(engines["plain"].history)
