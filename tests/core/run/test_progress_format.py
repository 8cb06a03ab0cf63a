"""Rates in progress lines stay readable at both ends: a 3-D volume on a CPU is not '0 examples/s'."""

import io

import pytest
from rich.console import Console

from tpulaunch.run.events import RunRecorder
from tpulaunch.cli.render.run_live import LiveRenderer
from tpulaunch.cli.render.run_plain import PlainRenderer
from tpulaunch.cli.render.run_text import format_rate


@pytest.mark.parametrize("rate, text", [(0.4, "0.4"), (3.26, "3.3"), (9.99, "10"), (983.2, "983"), (2637.0, "2637")])
def test_format_rate(rate, text):
    assert format_rate(rate) == text


def test_skipped_records_add_up_over_sessions_even_one_cut_short():
    """Each session's counters start at zero (an evaluation in between, a resume, or MonitoredSession
    recreating a session after an Aborted error, when no end() comes): the total keeps them all."""
    out = io.StringIO()
    recorder = RunRecorder(total_steps=10, batch_size=4)
    recorder.subscribe(PlainRenderer(Console(file=out, width=200)))
    assert recorder.skipped is None  # nobody counts: the summary says nothing
    recorder.skip_counting_began()
    recorder.records_skipped(0)
    recorder.records_skipped(3)
    recorder.records_skipped(3, session_ended=True)  # evaluation follows
    recorder.skip_counting_began()
    recorder.records_skipped(2)  # this session is recreated without an end()
    recorder.skip_counting_began()
    recorder.records_skipped(4)
    assert recorder.skipped == 9
    recorder.records_skipped(5, session_ended=True)
    assert recorder.summary().records_skipped == 10
    assert out.getvalue().splitlines() == ["data.skip_corrupt: skipping records that fail to parse (3 so far)"]


def test_live_display_shows_skipped_records():
    out, now = io.StringIO(), [0.0]
    recorder = RunRecorder(total_steps=10, batch_size=4, get_time=lambda: now[0])
    live = recorder.subscribe(LiveRenderer(Console(file=out, force_terminal=True, width=160, no_color=True),
                                           get_time=recorder.get_time, auto_refresh=False))
    recorder.skip_counting_began()
    recorder.session_began(0)
    now[0] = 1.0
    recorder.steps_run(4, 0.5)
    live.refresh()
    assert "skipped" not in out.getvalue().replace("skipping", "")
    recorder.records_skipped(2)
    recorder.steps_run(5, 0.5)
    live.refresh()
    assert "5/10 5.0 steps/s 20 ex/s loss 0.5 eta 0:00:01  skipped 2" in out.getvalue()
