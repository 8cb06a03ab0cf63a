"""`tpulaunch validate`: every check, all problems at once, as text, json or GitHub annotations."""

from __future__ import annotations

import click

from tpulaunch.cli.base import Context, command, format_option, pass_obj, set_option
from tpulaunch.errors import AlreadyReported


@command()
@click.argument("job_files", metavar="JOB.yaml...", nargs=-1, required=True, type=click.Path(path_type=str))
@set_option
@format_option
@click.option("--static", is_flag=True, help="Only checks that need neither TensorFlow nor the network (fast; for pre-commit and editors).")
@click.option("--records", "records_per_file", type=click.IntRange(min=1), default=2, show_default=True,
              help="Records to sample per data file.")
@click.option("--all-records", is_flag=True, help="Read every record: exact counts and corruption across whole files (contents are checked on the --records sample of each file).")
@click.option("--tf", "use_tf", is_flag=True, help="Also build the TPU graph with TensorFlow's own TPUEstimator for the declared slice (offline).")
@click.option("--local", is_flag=True, help="Check for this machine's CPU/GPU, the target `train --local` uses "
                                            "(tpu: and partition: do not apply).")
@pass_obj
def validate(obj: Context, job_files, overrides, fmt, static, records_per_file, all_records, use_tf, local):
    """Check job files: schema, partitioning, batch arithmetic, paths, model and data.

    Every problem is reported at once as FILE:LINE:COL: path: message, with a hint.
    Exit code 0 when there are no errors (warnings allowed), 1 when there are.

    \b
    Examples:
      tpulaunch validate configs/unet3d_ct.yaml
      tpulaunch validate jobs/*.yaml --static --format github   # in CI, as annotations
      tpulaunch validate job.yaml --set train.batch_size=48      # try a change without editing
      tpulaunch validate job.yaml --local                        # as `train --local` runs it (CI smoke runs)
    """
    from tpulaunch.checks.validate import validate_job
    from tpulaunch.cli.render.problems import PlainText, render_text, to_github, to_json
    from tpulaunch.tf_env import bound_gcs_retries

    if local and use_tf:
        raise click.UsageError("--tf checks the declared TPU slice; --local checks this machine: use one")
    bound_gcs_retries()
    results = []
    for job_file in job_files:
        status = None
        err = obj.text_out(stderr=True)
        if fmt == "text" and not isinstance(err, PlainText) and err.is_terminal:
            status = err.status(f"validating {job_file}")
            status.start()

        def on_stage(name: str, status=status, job_file=job_file):
            if status is not None:
                status.update(f"{job_file}: checking {name}")

        try:
            result = validate_job(job_file, overrides, static=static, records_per_file=records_per_file,
                                  all_records=all_records, use_tf=use_tf, on_stage=on_stage, local=local)
        finally:
            if status is not None:
                status.stop()
        results.append(result)
        if fmt == "text":
            render_text(obj.text_out(), result.problems, file=result.file, checked=result.checked)
            _render_details(obj, result)
    if fmt == "json":
        import json

        docs = [json.loads(to_json(r.problems, file=r.file, extra=_json_extra(r))) for r in results]
        click.echo(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
    elif fmt == "github":
        for r in results:
            text = to_github(r.problems)
            if text:
                click.echo(text)
            click.echo(f"tpulaunch validate {r.file}: {'ok' if r.ok else 'errors found'}")
    if not all(r.ok for r in results):
        raise AlreadyReported()


def _json_extra(result) -> dict:
    from dataclasses import asdict, is_dataclass

    extra = {"checked": result.checked}
    if result.data_reports:
        extra["data"] = [asdict(r) if is_dataclass(r) else r for r in result.data_reports]
    extra.update(result.extra)
    return extra


def _render_details(obj: Context, result) -> None:
    if result.data_reports or result.extra.get("tensorflow"):
        from tpulaunch.cli.render.plan import render_data_report, render_tf_built

        for report in result.data_reports:
            render_data_report(obj.out, report)
        if result.extra.get("tensorflow"):
            render_tf_built(obj.out, result.extra["tensorflow"])
