"""`tpulaunch explain JOB.yaml [-o FILE]`: print (or write) the TPUEstimator program a job stands for."""

from __future__ import annotations

import os

import click

from tpulaunch.cli.base import Context, command, job_argument, pass_obj, set_option


@command()
@job_argument
@set_option
@click.option("-o", "--out", "output", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Write the script to this file instead of printing it.")
@pass_obj
def explain(obj: Context, job_file: str, overrides, output):
    """Print a standalone TensorFlow 2.15 script that does what `tpulaunch train` does for JOB.yaml.

    The script imports only TensorFlow and the job's own model code. Its middle is the module
    `tpulaunch train` runs (input pipeline, model_fn, TPUEstimator), verbatim; each value taken from
    the job file is commented with its key and line. `python SCRIPT evaluate` evaluates the latest
    checkpoint, as `tpulaunch evaluate` does.
    """
    from tpulaunch.cli.gate import load_checked
    from tpulaunch.engine.base import engine_for

    checked = load_checked(job_file, overrides, verb="explaining")
    script = engine_for(checked.job).program(checked.loaded, checked.plan)
    if output is None:
        click.echo(script, nl=False)
        return
    with open(output, "w", encoding="utf-8") as handle:
        handle.write(script)
    os.chmod(output, 0o755)
    obj.err.print(f"wrote {output}: run it with `python {output}`", highlight=False)
