"""harness/bench/models/host_path.py: its table and bad input (the profile itself: tests/compiler/test_host_path.py)."""

from __future__ import annotations

from harness.bench.models import host_path


def test_unknown_case_is_one_line_and_exit_2(capsys):
    assert host_path.main(["--only", "model.nothing_like_this*"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("host_path: no tiny model matches")


def test_table_has_every_column_and_dashes_for_missing_values():
    row = {c: 1.0 for c in host_path.COLUMNS}
    row.update(case="model.a", launches=12, old_us_per_launch=None, us_per_launch=2.345)
    lines = host_path.table([row])
    assert lines[0] == "| case | " + " | ".join(host_path.COLUMNS) + " |"
    assert lines[2].startswith("| model.a | 1.0 | 1.0 | 1.0 | 12 | 2.35 | - |")
