"""What `tpulaunch plan` does with the job the gate checked: its Plan, with the per-core memory estimate (and XLA's
own answer) when asked, and TensorFlow's own build for its slice (`--tf`), whose rejections refuse the plan."""

from __future__ import annotations


def planned(checked, *, memory: bool, xla: bool, tpu_compiler: bool, use_tf: bool):
    """(the Plan, with what was asked added; TensorFlow's build per mode, or None without `use_tf`)."""
    from tpulaunch.plan.memory import add_memory

    the_plan = _on_this_machine(checked)
    if memory or xla:
        import os

        from tpulaunch.seam.registry import about
        from tpulaunch.tf_env import import_tensorflow

        os.environ.update(about(the_plan.engine).process_environment)  # the engine's own, before the job's code loads
        import_tensorflow()  # before the job's builder imports it: its start-up lines stay off the terminal
        add_memory(the_plan, checked.job, checked.engine.step_tensors, xla=xla)
        if tpu_compiler:
            from tpulaunch.plan.xla_tpu import add_xla_answer

            add_xla_answer(the_plan, checked.job)
    built = None
    if use_tf:
        built = _tensorflow_verdict(checked)
    return the_plan, built


def _on_this_machine(checked):
    """A local job's Plan over the devices its run splits each batch over (an engine that finds them itself: its
    `devices_here`), else the gate's Plan as it is."""
    from tpulaunch.app.gate import JobRefused
    from tpulaunch.plan.build import on_devices
    from tpulaunch.plan.mesh import DevicesRefused
    from tpulaunch.seam.about import load_attribute
    from tpulaunch.seam.registry import about

    engine = about(checked.plan.engine)
    if checked.plan.slice is not None or engine.layout.devices_here is None:
        return checked.plan
    count, platform = load_attribute(engine.layout.devices_here)()
    try:
        return on_devices(checked.plan, checked.job, count, platform)
    except DevicesRefused as refused:  # at `partition`, as `train` refuses it
        raise JobRefused(f"not planning {checked.file}: fix the problem above",
                         problems=[checked.loaded.problem(refused.key, refused.code, refused.message,
                                                          refused.hint)]) from None


def _tensorflow_verdict(checked) -> dict:
    """TensorFlow's own build of the checked job for its slice (validate --tf's stage, on the job and Plan the gate
    checked once); its rejections refuse the plan."""
    from tpulaunch.app.gate import JobRefused
    from tpulaunch.checks.validate import tensorflow_verdict

    problems, built = tensorflow_verdict(checked.loaded, checked.plan)
    errors = [p for p in problems if p.is_error]
    if errors:
        raise JobRefused(f"not planning {checked.file}: fix the problems above (tpulaunch validate {checked.file} --tf)",
                         problems=errors)
    return built or {}
