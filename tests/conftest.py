"""Fixtures shared by the engine tests."""

import pytest
import torch

from ai_evolution.model.checkpoint import load_pretrained, random_model


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread: these models are too small to gain from more, and on a shared 2-core
    machine a second thread that has to wait for a core makes every matmul many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny():
    """The shipped tiny-es model (read-only: tests must not modify it)."""
    return load_pretrained("tiny-es")


@pytest.fixture(scope="module")
def small():
    """A 2-layer random model with grouped-query attention (``engine_helpers.SMALL``): cheap
    references for the property tests."""
    from engine_helpers import SMALL
    return random_model(SMALL, seed=3, init_std=0.2)
