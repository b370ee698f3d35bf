"""The guides' lines that want nothing serving (test_guide.BARE: the deployment's `down` lines, then
`doctor`, `doctor --fabric` and `init` as the guides run them before `up`), in test_guide's owner
environment. In the serving tail after test_supervisor_final (tests/conftest.py SERVING_TAIL), whose
closing `down` leaves nothing serving, so that module's final states use test_guide's cluster and start
none of their own; test_fabric, after this module, wants nothing serving too."""

from __future__ import annotations

import pytest

from tests.integration.test_guide import BARE, owner, run_line  # noqa: F401 (owner: test_guide's fixture)

pytestmark = pytest.mark.testbed


@pytest.mark.parametrize("line", BARE)
def test_the_guides_line_runs_with_nothing_serving(owner, tmp_path, line):  # noqa: F811
    run_line(owner, tmp_path, line)
