"""`tpulaunch explain JOB.yaml [--engine NAME] [-o FILE]`: print (or write) the program a job stands for."""

from __future__ import annotations

import dataclasses
import os

import click

from tpulaunch.cli.base import Context, command, job_argument, pass_obj, set_option
from tpulaunch.seam.registry import names as engine_names
from tpulaunch.errors import TpuLaunchError

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
    from tpulaunch.app.gate import JobRefused, load_checked

    # The job is checked under the engine's rules, as `tpulaunch train` would check it on that engine.
    sets = [*overrides, f"run.engine={engine}"] if engine else list(overrides)
    try:
        checked = load_checked(job_file, sets, verb="explaining")
    except JobRefused as exc:
        if engine:
            _refuse_other_engines_keys(job_file, engine, exc)
        raise
    script = checked.engine.program(checked.loaded, checked.plan)
    if output is None:
        click.echo(script, nl=False)
        return
    with open(output, "w", encoding="utf-8") as handle:
        handle.write(script)
    _make_executable(output)
    obj.err.print(f"wrote {output}: run it with `python {output}`", highlight=False)


def _make_executable(path: str) -> None:
    """`chmod +x` as the shell does it: executable where the umask lets a new file be (0700 under umask 077,
    0755 under 022), never opened wider than the umask would make it."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, os.stat(path).st_mode | (0o111 & ~umask))


def _refuse_other_engines_keys(job_file: str, engine: str, refused: TpuLaunchError) -> None:
    """--engine ENGINE on a job with keys only another engine runs (`EngineAbout.own_keys`: TPUEstimator's own
    functions): those keys, what to do, exit 1."""
    from tpulaunch.checks.engine_rules import owner_of

    owners = {id(p): owner_of(p) for p in refused.problems}
    only = [p for p in refused.problems if owners[id(p)]]
    if not only:
        return
    problems = [dataclasses.replace(p, hint=f"explain it with --engine {owners[id(p)][0]} (its program), or "
                                            f"{owners[id(p)][1].instead}") if owners[id(p)] else p
                for p in refused.problems]
    keys = " and ".join(p.path for p in only)
    owner = owners[id(only[0])][0]
    raise TpuLaunchError(
        f"no {engine} program for {job_file}: {keys} {'is' if len(only) == 1 else 'are'} the {owner} engine's own "
        "(only it runs them)",
        hint=f"drop --engine {engine} (or use --engine {owner}) for the {owner} engine's program", problems=problems)
