"""Rates in progress lines stay readable at both ends: a 3-D volume on a CPU is not '0 examples/s'."""

import pytest

from tpulaunch.run.progress import format_rate


@pytest.mark.parametrize("rate, text", [(0.4, "0.4"), (3.26, "3.3"), (9.99, "10"), (983.2, "983"), (2637.0, "2637")])
def test_format_rate(rate, text):
    assert format_rate(rate) == text


def test_skipped_records_add_up_over_sessions_even_one_cut_short():
    """Each session's counters start at zero (an evaluation in between, a resume, or MonitoredSession
    recreating a session after an Aborted error, when no end() comes): the total keeps them all."""
    import io

    from rich.console import Console

    from tpulaunch.run.progress import TrainProgress

    out = io.StringIO()
    progress = TrainProgress(Console(file=out, width=200), total_steps=10, batch_size=4, plain=True)
    assert progress.skipped is None  # nobody counts: the summary says nothing
    progress.session_counts_skipped_records()
    progress.records_skipped(0)
    progress.records_skipped(3)
    progress.records_skipped(3, session_ended=True)  # evaluation follows
    progress.session_counts_skipped_records()
    progress.records_skipped(2)  # this session is recreated without an end()
    progress.session_counts_skipped_records()
    progress.records_skipped(4)
    assert progress.skipped == 9
    progress.records_skipped(5, session_ended=True)
    assert progress.summary().records_skipped == 10
    assert out.getvalue().splitlines() == ["data.skip_corrupt: skipping records that fail to parse (3 so far)"]


def test_live_display_shows_skipped_records():
    import io

    from rich.console import Console

    from tpulaunch.run.progress import TrainProgress

    out, now = io.StringIO(), [0.0]
    progress = TrainProgress(Console(file=out, force_terminal=True, width=160, no_color=True), total_steps=10,
                             batch_size=4, plain=False, auto_refresh=False, get_time=lambda: now[0])
    progress.session_counts_skipped_records()
    progress.begin(0)
    now[0] = 1.0
    progress.update(4, 0.5)
    progress._live.refresh()  # pylint: disable=protected-access
    assert "skipped" not in out.getvalue().replace("skipping", "")
    progress.records_skipped(2)
    progress.update(5, 0.5)
    progress._live.refresh()  # pylint: disable=protected-access
    assert "5/10 5.0 steps/s 20 ex/s loss 0.5 eta 0:00:01  skipped 2" in out.getvalue()
