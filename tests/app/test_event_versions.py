"""A stream's cursor reads the whole number a task version wraps through the SDK's public surface
(``app.events.version_number``), not through the SDK's private helper."""

from __future__ import annotations

import pytest
from a2a.server.cluster import TaskVersion
from hypothesis import given
from hypothesis import strategies as st

from app.events import version_number


@given(st.integers(min_value=1, max_value=2**61 - 2))
def test_a_version_reads_back_as_the_whole_number_it_wraps(number: int) -> None:
    assert version_number(TaskVersion(number)) == number


@pytest.mark.parametrize("value", ["7", "v1", 2**61 - 1 + 7])
def test_a_version_that_wraps_anything_else_is_refused(value: object) -> None:
    with pytest.raises(TypeError):
        version_number(TaskVersion(value))  # type: ignore[arg-type]
