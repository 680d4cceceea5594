"""A pytest plugin (`-p harness.suites.shard_plugin --kiln-shard I/N [--kiln-durations FILE] [--kiln-shard-offset K]
[--kiln-shard-record FILE]`) that keeps only shard I of N of the collected tests (see harness.suites.shard: the split depends only on the
collected node ids and the durations file, so every shard of a run agrees and each test runs in exactly one).

The tests outside the shard are deselected after every other selection (`-k`, `-m`), so the shards partition
what an unsharded run would run. `--kiln-shard-record FILE` writes what this process collected and selected
(JSON: shard, collected count and digest, durations digest, selected ids), which `harness merge` checks.
"""

from __future__ import annotations

import json

import pytest

from harness.exc import HarnessError
from harness.suites import shard as shard_mod


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kiln-shard", "kiln: run one shard of the tests")
    group.addoption("--kiln-shard", metavar="I/N", help="run only shard I of N of the collected tests")
    group.addoption("--kiln-durations", metavar="FILE", help="test durations that balance the shards")
    group.addoption(
        "--kiln-shard-offset",
        type=int,
        default=0,
        metavar="K",
        help="ties go to shard K+1 first (the harness gives its k-th suite offset k)",
    )
    group.addoption(
        "--kiln-shard-record", metavar="FILE", help="write the shard's collected/selected ids here"
    )


def _shard(config: pytest.Config) -> shard_mod.Shard | None:
    text = config.getoption("kiln_shard")
    if text is None:
        return None
    try:
        return shard_mod.parse_shard(text)
    except HarnessError as e:
        raise pytest.UsageError(str(e)) from None


def pytest_configure(config: pytest.Config) -> None:
    _shard(config)  # a bad value stops the run before collection


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    shard = _shard(config)
    if shard is None:
        return
    path = config.getoption("kiln_durations")
    try:
        durations = shard_mod.load_durations(path) if path else {}
    except HarnessError as e:
        raise pytest.UsageError(str(e)) from None
    ids = [item.nodeid for item in items]
    offset = config.getoption("kiln_shard_offset")
    keep = set(shard_mod.select(ids, shard, durations, offset))
    selected = [item for item in items if item.nodeid in keep]
    deselected = [item for item in items if item.nodeid not in keep]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = selected
    record = config.getoption("kiln_shard_record")
    if record:
        from harness.results import atomic_write_text

        atomic_write_text(
            record,
            json.dumps(
                {
                    "shard": [shard.index, shard.count],
                    "offset": offset,
                    "collected": len(ids),
                    "collected_sha256": shard_mod.digest(ids),
                    "durations_sha256": shard_mod.durations_digest(durations) if path else None,
                    "selected": [item.nodeid for item in selected],
                },
                indent=1,
            )
            + "\n",
        )
