"""compiler/phase_times.py: exclusive and inclusive seconds of nested phases."""

import time

from compiler import phase_times


def test_nested_phases_are_exclusive_and_sum_within_the_wall_time():
    phase_times.reset()
    start = time.perf_counter()
    with phase_times.phase("outer"):
        time.sleep(0.01)
        with phase_times.phase("inner"):
            time.sleep(0.02)
        with phase_times.phase("inner"):
            time.sleep(0.01)
    wall = time.perf_counter() - start
    ex, inc, n = phase_times.totals(), phase_times.inclusive(), phase_times.counts()
    assert n == {"outer": 1, "inner": 2}
    assert ex["inner"] == inc["inner"] >= 0.03
    assert abs(inc["outer"] - ex["outer"] - inc["inner"]) < 1e-9
    assert ex["outer"] >= 0.01 and ex["outer"] + ex["inner"] <= wall
    phase_times.reset()
    assert phase_times.totals() == {} and phase_times.counts() == {}


def test_a_phase_that_raises_is_still_counted():
    phase_times.reset()
    try:
        with phase_times.phase("boom"):
            raise ValueError("x")
    except ValueError:
        pass
    assert phase_times.counts() == {"boom": 1}
