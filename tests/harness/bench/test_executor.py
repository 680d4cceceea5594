"""The executor's timing guard (`gc_paused`): the cyclic collector off inside a sample and restored after, the young
garbage collected before it, the old generation (torch's and the compiled code's objects) not walked each time."""

from __future__ import annotations

import gc
import weakref

from harness.bench.core.executor import gc_paused


class Node:
    """An object that can sit in a reference cycle (only the cyclic collector frees it)."""

    def __init__(self) -> None:
        self.me = self


def test_the_collector_is_off_inside_and_restored_after():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a caller's disabled collector stays disabled
    finally:
        gc.enable()


def test_young_garbage_is_collected_first_and_the_old_generation_is_left_alone():
    gc.disable()  # no automatic collection in between: what is collected is gc_paused's doing
    try:
        old = Node()
        old_ref = weakref.ref(old)
        gc.collect()  # a survivor of a full collection: in the oldest generation
        del old
        young = Node()
        young_ref = weakref.ref(young)
        del young
        with gc_paused():
            assert young_ref() is None  # the cycle made just before the sample: collected on entry
            assert old_ref() is not None  # the old generation was not walked
        gc.collect()
        assert old_ref() is None  # garbage all the same, freed by the next full collection
    finally:
        gc.enable()
