"""The words and numbers of run events, as both renderers write them (one copy of each wording)."""

from __future__ import annotations

from typing import List, Optional

from tpulaunch.run.events import (INPUT_BOUND_SHARE, INPUT_MATTERS_SHARE, EvalResult, InputShare, LeftOut, NodeEvent,
                                  NodeReady, NodeWaiting, PhaseEnded, PhaseSlow, PhaseStarted, ProfileCaptured,
                                  StepProgress, TrainingStarted, TrainSummary)
from tpulaunch.run.phases import CHECKPOINT, CLOSE, TRAINING

# Phases without start and end lines: their own lines (train | step..., checkpoint | step...) say
# where the run is, or they are short and come after every session (closing it). They still count in
# the run record, and say so when they run far too long.
QUIET_PHASES = (TRAINING, CHECKPOINT, CLOSE)


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def format_value(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.4g}"


def format_rate(value: float) -> str:
    """Whole numbers for fast rates; decimals where a whole number would read 0 (big volumes on a CPU)."""
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def format_eta(steps: StepProgress) -> str:
    return "-" if steps.eta_s is None else format_duration(steps.eta_s)


def skipped_text(count: int) -> str:
    """How summaries and evaluations state the records dropped under data.skip_corrupt."""
    return f"{count} record{'s' if count != 1 else ''} skipped (data.skip_corrupt)"


def first_skipped_text(count: int) -> str:
    return f"data.skip_corrupt: skipping records that fail to parse ({count} so far)"


def start_text(event: TrainingStarted) -> str:
    where = f" | model_dir {event.model_dir}" if event.model_dir else ""
    return f"train | start | step {event.step}/{event.total_steps} | batch {event.batch_size}{where}\n{loss_note(event)}"


def loss_note(event: TrainingStarted) -> str:
    """What the loss on the progress and done lines is: the same on every engine."""
    window = f"mean of the last {event.loss_window} steps' losses" if event.loss_window > 1 else "the last step's loss"
    return f"train | loss: {window}, each the loss the optimizer minimizes (regularizers included)"


def train_text(steps: StepProgress) -> str:
    parts = [f"train | step {steps.step}/{steps.total_steps}"]
    if steps.steps_per_sec is None:
        parts += ["- steps/s", "- examples/s"]
    else:
        parts += [f"{steps.steps_per_sec:.1f} steps/s", f"{format_rate(steps.examples_per_sec)} examples/s"]
    parts.append(f"loss {format_value(steps.loss)}")
    parts.append(f"eta {format_eta(steps)}")
    if steps.skipped:
        parts.append(f"skipped {steps.skipped}")
    return " | ".join(parts)


def metric_names(result: EvalResult) -> List[str]:
    """The metrics in the order they are shown: by name, loss last."""
    shown = result.metrics
    return sorted(k for k in shown if k != "loss") + (["loss"] if "loss" in shown else [])


def eval_text(result: EvalResult) -> str:
    parts = [f"eval | step {result.step}"] + [f"{k} {format_value(result.metrics[k])}" for k in metric_names(result)]
    if result.records_skipped is not None:
        parts.append(skipped_text(result.records_skipped))
    if result.left_out is not None:
        parts.append(left_out_text(result.left_out))
    return " | ".join(parts)


def left_out_text(left_out: LeftOut) -> str:
    """How an evaluation states that its metrics are over fewer examples than the eval set holds."""
    records = f"{left_out.records} record{'s' if left_out.records != 1 else ''}"
    return f"over {left_out.examples} examples: the last {records}, not a whole batch, left out"


def node_lost_text(event: NodeEvent) -> str:
    checkpoint = f"checkpoint step {event.checkpoint_step}" if event.checkpoint_step else "no checkpoint"
    return f"tpu | {event.detail} | step {event.step} | {checkpoint} | {event.steps_lost} steps lost"


def node_waiting_text(event: NodeWaiting) -> str:
    return f"tpu | waiting for READY/HEALTHY | {event.state} | {event.seconds_left:.0f} s left"


def node_ready_text(event: NodeReady) -> str:
    made = f" | recreated in {event.recreated_in_s:.1f} s" if event.recreated_in_s is not None else ""
    return f"tpu | {event.state}{made} | resuming from step {event.step} (resume {event.resume} of {event.allowed})"


def _recovery(event: NodeEvent) -> str:
    """', recreated, back in 4.2 s' after an event training came back from (nothing otherwise)."""
    if event.recovery_s is None:
        return ""
    return f"{', recreated' if event.recreated else ''}, back in {event.recovery_s:.1f} s"


def format_share(share: float) -> str:
    return f"{share * 100:.0f} %"


def phase_shown(name: str) -> bool:
    """Whether a phase's start and end are written (not for QUIET_PHASES)."""
    return name not in QUIET_PHASES


def phase_started_text(event: PhaseStarted) -> str:
    return f"phase | {event.name}" + (f" | {event.detail}" if event.detail else "")


def phase_ended_text(event: PhaseEnded) -> str:
    return f"phase | {event.name} | {event.seconds:.1f} s"


def phase_slow_text(event: PhaseSlow) -> str:
    if event.last_step is not None:
        head = f"phase | still {event.name}: no step finished for {event.seconds:.0f} s (step {event.last_step})"
    else:
        head = f"phase | still {event.name} after {event.seconds:.0f} s"
    return " | ".join([head, f"usually under {event.usual_s:.0f} s", *event.known])


def input_verdict(share: float) -> str:
    if share >= INPUT_BOUND_SHARE:
        return "input-bound"
    return "partly input-bound" if share >= INPUT_MATTERS_SHARE else "not input-bound"


def input_text(event: InputShare) -> str:
    parts = [f"input | steps waited for input {format_share(event.share)} of {event.seconds:.1f} s of training",
             input_verdict(event.share)]
    if event.bound and event.help:
        parts.append("may help: " + "; ".join(event.help))
    return " | ".join(parts)


def profile_text(event: ProfileCaptured) -> str:
    return (f"profile | steps {event.first}-{event.last} | {event.path} | open it: tensorboard --logdir {event.logdir} "
            "(Profile tab)")


def summary_text(s: TrainSummary) -> str:
    head = f"stopped ({s.stopped_by})" if s.stopped_by else "done"
    rate = "-" if s.steps_per_sec is None else f"{s.steps_per_sec:.1f}"
    examples = "-" if s.examples_per_sec is None else format_rate(s.examples_per_sec)
    parts = [f"{head} | step {s.final_step}/{s.total_steps}", f"{s.steps_run} steps in {s.seconds:.1f} s",
             f"{rate} steps/s", f"{examples} examples/s", f"loss {format_value(s.loss)}"]
    if s.goodput is not None:
        parts.append(f"goodput {format_share(s.goodput)}")
    if s.last_checkpoint:
        parts.append(f"checkpoint {s.last_checkpoint}")
    if s.events:
        lost = "; ".join(f"{e.detail} at step {e.step}{_recovery(e)}" for e in s.events)
        parts.append(f"{len(s.events)} TPU event{'s' if len(s.events) != 1 else ''} ({lost})")
        parts.append(f"{s.resumes} resume{'s' if s.resumes != 1 else ''}")
        parts.append(f"{s.steps_lost} steps lost")
    if s.records_skipped is not None:
        parts.append(skipped_text(s.records_skipped))
    return " | ".join(parts)
