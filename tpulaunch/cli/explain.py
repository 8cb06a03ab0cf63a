"""`tpulaunch explain JOB.yaml [--engine NAME] [-o FILE]`: print (or write) the program a job stands for (what it
is, `app/explain.py`'s)."""

from __future__ import annotations

import click

from tpulaunch.cli.base import Context, command, job_argument, pass_obj, set_option
from tpulaunch.seam.registry import names as engine_names


@command(epilog="""\b
Examples:
  tpulaunch explain job.yaml                       # the program of the job's engine
  tpulaunch explain job.yaml -o program.py         # write it; then: python program.py [train|evaluate]
  tpulaunch explain job.yaml --engine keras        # a TPUEstimator job migrated to Keras + tf.distribute
  tpulaunch explain job.yaml --engine estimator    # the TPUEstimator program (any TensorFlow installed)
""")
@job_argument
@set_option
@click.option("--engine", type=click.Choice(engine_names()), default=None,
              help="The engine whose program to print (default: the job's run.engine, else the installed "
                   "TensorFlow's). keras on a TPUEstimator job prints its migration to Keras + tf.distribute.")
@click.option("-o", "--out", "output", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Write the program to this file instead of printing it.")
@pass_obj
def explain(obj: Context, job_file: str, overrides, engine, output):
    """Print a standalone TensorFlow program that does what `tpulaunch train` does for JOB.yaml.

    The program imports only TensorFlow and the job's own model code (tpulaunch's reference models
    are copied in). Its middle is the engine's own code that `tpulaunch train` runs (input pipeline,
    model, training and evaluation), verbatim; each value taken from the job file is commented with
    its key and line. `python PROGRAM evaluate` evaluates the latest checkpoint, as `tpulaunch
    evaluate` does.

    The estimator engine's program is TPUEstimator on TensorFlow 2.15; the keras engine's is Keras 2
    (tf-keras) with tf.distribute on TensorFlow 2.16 and later; the jax engine's is Keras 3 on JAX
    (with TensorFlow's tf.data for the records). --engine keras on a TPUEstimator
    builder job shows the same job on Keras + tf.distribute (jobs with model.model_fn or data.input_fn,
    TPUEstimator's own functions, have no keras program). Writing the program imports no TensorFlow.
    """
    from tpulaunch.app.explain import program, write_program

    script = program(job_file, overrides, engine)
    if output is None:
        click.echo(script, nl=False)
        return
    write_program(output, script)
    obj.err.print(f"wrote {output}: run it with `python {output}`", highlight=False)
