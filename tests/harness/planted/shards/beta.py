"""Planted suite `beta` for tests/harness/test_shard.py (copied into a scratch project as
tests/beta/test_beta.py): a few passing tests."""

import pytest


@pytest.mark.parametrize("word", ["a", "b", "c", "d", "e"])
def test_word(word):
    assert word.isalpha()
