"""`tpulaunch plan`: how the job lands on its slice, and whether it fits in memory."""

from __future__ import annotations

import click

from tpulaunch.cli.base import Context, command, job_argument, pass_obj, set_option, text_or_json_option
from tpulaunch.errors import AlreadyReported


@command()
@job_argument
@set_option
@text_or_json_option
@click.option("--memory/--no-memory", "memory", default=True, show_default=True,
              help="Estimate per-core memory (builds the model's layer shapes with TensorFlow; "
                   "--no-memory keeps plan static and TensorFlow-free).")
@click.option("--xla", is_flag=True, help="Also compile one training step with XLA on the CPU and show its own "
                                          "buffer-assignment total (float32, no TPU tiling; minutes for big models).")
@click.option("--tpu-compiler/--no-tpu-compiler", "tpu_compiler", default=True, show_default=True,
              help="Ask XLA's TPU compiler (where installed: requirements/xla.txt, TPULAUNCH_XLA_PYTHON) whether the "
                   "job's step fits, compiled for its TPU type on this machine; else the estimate answers.")
@click.option("--tf", "use_tf", is_flag=True, help="Also build the graphs with TensorFlow's own TPUEstimator for the "
                                                   "declared slice (offline) and show the pieces it cut.")
@pass_obj
def plan(obj: Context, job_file, overrides, fmt, memory, xla, tpu_compiler, use_tf):
    """Show how the job lands on the TPU: tiles per core, replicas, batch arithmetic, memory per core.

    \b
    Examples:
      tpulaunch plan configs/unet3d_ct.yaml
      tpulaunch plan job.yaml --set tpu.type=v3-32 --format json
      tpulaunch plan job.yaml --no-memory        # static only, no TensorFlow
      tpulaunch plan job.yaml --xla              # cross-check with XLA's buffer assignment
      tpulaunch plan job.yaml --tf               # and TensorFlow's own per-core pieces
    """
    from tpulaunch.app.gate import JobRefused, load_checked
    from tpulaunch.app.plan import planned

    try:
        checked = load_checked(job_file, overrides, verb="planning")
    except JobRefused as refused:
        if fmt != "json":
            raise
        from tpulaunch.cli.render.problems import to_json

        click.echo(to_json(refused.problems, file=job_file))  # tools read the problems from stdout
        raise AlreadyReported() from None
    the_plan, built = planned(checked, memory=memory, xla=xla, tpu_compiler=tpu_compiler, use_tf=use_tf)
    if fmt == "json":
        import json

        doc = the_plan.to_dict()
        if built is not None:
            doc["tensorflow"] = {mode: {k: v for k, v in info.items() if k != "traceback"} for mode, info in built.items()}
        click.echo(json.dumps(doc, indent=2))
    else:
        from tpulaunch.cli.render.plan import render_plan, render_tf_built

        render_plan(obj.out, the_plan)
        if built:
            render_tf_built(obj.out, built)
