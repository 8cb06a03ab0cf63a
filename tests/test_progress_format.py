"""Rates in progress lines stay readable at both ends: a 3-D volume on a CPU is not '0 examples/s'."""

import pytest

from tpulaunch.progress import format_rate


@pytest.mark.parametrize("rate, text", [(0.4, "0.4"), (3.26, "3.3"), (9.99, "10"), (983.2, "983"), (2637.0, "2637")])
def test_format_rate(rate, text):
    assert format_rate(rate) == text
