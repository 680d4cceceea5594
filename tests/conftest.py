"""Shared fixtures: fixed seeds, a fresh Dynamo cache per test, and the device the suites run on."""

from __future__ import annotations

import random

import pytest
import torch

import compiler  # noqa: F401  (registers the "kiln" backend)
from kiln_testing import DEVICE


@pytest.fixture
def device() -> str:
    """The device every suite compiles for: CUDA/ROCm when present, else CPU through Triton's interpreter."""
    return DEVICE


@pytest.fixture(autouse=True)
def _fresh_state():
    """Fixed seeds and no Dynamo cache carried between tests."""
    torch.manual_seed(0)
    random.seed(0)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
