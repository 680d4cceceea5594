"""A pytest plugin (`-p harness.suites.flake_plugin`) that writes each test's exact node id into the JUnit XML.

JUnit XML names a test by `classname` + `name`, from which the pytest node id (the id the quarantine file
and the repro lines use) cannot always be recovered. With this plugin every `<testcase>` carries:
  kiln_nodeid     the node id relative to the rootdir, without pytest-flakefinder's run index
  kiln_flake_run  pytest-flakefinder's run index (0..N-1) when `--flake-finder` is on

pytest-flakefinder parametrizes every test with a fixture `__flakefinder_<function>`; its parametrization
runs first (tryfirst), so its id comes first in the test's parameter id: `test_x[3]`, or `test_x[3-a]` when
the test has its own parameters.
"""

from __future__ import annotations

import pytest

_FLAKE_FIXTURE = "__flakefinder_"


def flake_run(item: pytest.Item) -> int | None:
    """The flakefinder run index of `item`, or None when flakefinder did not parametrize it."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    for name, value in callspec.params.items():
        if name.startswith(_FLAKE_FIXTURE) and isinstance(value, int):
            return value
    return None


def base_nodeid(nodeid: str, name: str, originalname: str, run: int | None) -> str:
    """`nodeid` with flakefinder's run index taken out of its parameter id.

    `name` is the item's name (`test_x[3-a]`), `originalname` the function's (`test_x`); the parameter id
    is cut from `name` rather than parsed out of `nodeid`, because parameter ids may contain `[`, `-`, `::`.
    """
    if run is None or not name.startswith(f"{originalname}[") or not nodeid.endswith(name):
        return nodeid
    head = nodeid[: len(nodeid) - len(name)]
    params = name[len(originalname) + 1 : -1]
    if params == str(run):
        return f"{head}{originalname}"
    if params.startswith(f"{run}-"):
        return f"{head}{originalname}[{params[len(str(run)) + 1 :]}]"
    return nodeid


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        run = flake_run(item)
        original = getattr(item, "originalname", None) or item.name
        item.user_properties.append(("kiln_nodeid", base_nodeid(item.nodeid, item.name, original, run)))
        if run is not None:
            item.user_properties.append(("kiln_flake_run", str(run)))
