"""`tpulaunch data`: write example TFRecords, look inside existing ones, time a job's input pipeline.

What each does is `app/data.py`'s (TensorFlow is imported there, inside each command); here, its options and
how its answer is shown.
"""

from __future__ import annotations

import json

import click

from tpulaunch.cli.base import (Context, Group, job_argument, local_option, pass_obj, set_option, text_or_json_option,
                                warnings_to)

EXAMPLE_NAMES = ("quickstart", "unet3d", "retinanet")
# Above this many records a progress bar is worth drawing.
PROGRESS_THRESHOLD = 200


@click.group(name="data", cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
def data():
    """Write example TFRecords, inspect TFRecords to declare them in a job, or time a job's input pipeline.

    \b
    tpulaunch data synth --example quickstart data/quickstart
    tpulaunch data inspect 'gs://my-bucket/ct/train-*.tfrecord'
    tpulaunch data bench job.yaml --seconds 20
    """


@data.command()
@click.option("--example", "name", type=click.Choice(EXAMPLE_NAMES), required=True,
              help="Which starter job the records are for.")
@click.argument("out_dir", metavar="OUT_DIR", type=str)
@click.option("--records", type=click.IntRange(min=1), default=None,
              help="Training records (eval gets 1/8 as many). Default: quickstart 2048, unet3d 32, retinanet 64.")
@click.option("--size", type=click.IntRange(min=1), default=None,
              help="Image or volume side. Default: quickstart 32, unet3d 32, retinanet 256 (a multiple of 128).")
@click.option("--shards", type=click.IntRange(min=1), default=None, help="Files per split.")
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same bytes.")
@pass_obj
def synth(obj: Context, name: str, out_dir: str, records, size, shards, seed: int):
    """Write synthetic train/eval TFRecords for the starter job --example into OUT_DIR (local or gs://).

    \b
    tpulaunch data synth --example quickstart data/quickstart
    tpulaunch data synth --example unet3d data/ct --size 32 --records 16
    tpulaunch data synth --example retinanet gs://my-bucket/detection --size 256
    """
    from tpulaunch.app import data as doing

    total = doing.planned_records(name, records, shards)
    if total >= PROGRESS_THRESHOLD and obj.err.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(TextColumn("writing {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeRemainingColumn(), console=obj.err, transient=True) as progress:
            task = progress.add_task(name, total=total)
            files = doing.synth(name, out_dir, records=records, shards=shards, seed=seed, size=size,
                                on_record=lambda: progress.advance(task))
    else:
        with obj.err.status(f"writing {total} {name} records"):
            files = doing.synth(name, out_dir, records=records, shards=shards, seed=seed, size=size)
    for path in files:
        obj.out.print(path, highlight=False, soft_wrap=True)
    obj.out.print(f"wrote {total} records in {len(files)} files", highlight=False)
    _print_next_step(obj, name, out_dir, size)


# The job in configs/ that each example's data is made for.
_EXAMPLE_JOBS = {"quickstart": "configs/quickstart.yaml", "unet3d": "configs/unet3d_ct.yaml",
                 "retinanet": "configs/retinanet_2560.yaml"}


def _print_next_step(obj: Context, name: str, out_dir: str, size) -> None:
    from tpulaunch.data.synth import template_overrides  # the words of the next step (no TensorFlow)

    sets = " ".join(f"--set '{s}'" for s in template_overrides(name, out_dir, size))
    job = _EXAMPLE_JOBS[name]
    obj.err.print(f"next: point a job's data.train/data.eval at these files, e.g. (job from `tpulaunch init --example {name}` "
                  f"or {job}):\n  tpulaunch train JOB.yaml --local {sets} --set run.model_dir=runs/{name}",
                  highlight=False, soft_wrap=True, markup=False)


@data.command(name="inspect")
@click.argument("pattern", metavar="PATH_OR_GLOB", type=str)
@click.option("--records", type=click.IntRange(min=1), default=5, show_default=True, help="Records to read.")
@click.option("--compression", type=click.Choice(["GZIP", "ZLIB"]), default=None, help="Compression of the files.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text for people, json for tools.")
@pass_obj
def inspect_command(obj: Context, pattern: str, records: int, compression, fmt: str):
    """Show what tf.train.Example records hold and print a `data.features:` block for the job file.

    \b
    tpulaunch data inspect data/quickstart/train-00000-of-00004.tfrecord
    tpulaunch data inspect 'gs://my-bucket/ct/train-*.tfrecord' --records 20
    tpulaunch data inspect 'data/*.tfrecord.gz' --compression GZIP --format json
    """
    from tpulaunch.app.data import inspect

    result = inspect(pattern, records=records, compression=compression)
    if fmt == "json":
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    from rich.table import Table

    table = Table(title=f"{result.records_read} records read; {len(result.files)} file(s) match", title_justify="left")
    for column in ("key", "kind", "values/record", "bytes", "looks like"):
        table.add_column(column)
    for key in sorted(result.keys):
        info = result.keys[key]
        lengths = str(info.min_length) if info.fixed_length else f"{info.min_length}..{info.max_length}"
        size = "" if info.min_bytes is None else (
            str(info.min_bytes) if info.min_bytes == info.max_bytes else f"{info.min_bytes}..{info.max_bytes}")
        looks = f"{info.image_format} {info.image_shape}" if info.image_format else ""
        table.add_row(key, info.kind, lengths, size, looks)
    obj.out.print(table)
    obj.out.print("\n# paste under data: (move targets to a labels: block)", highlight=False, markup=False)
    obj.out.print(result.features_yaml().rstrip("\n"), highlight=False, markup=False, soft_wrap=True)


@data.command()
@job_argument
@local_option
@set_option
@click.option("--seconds", type=click.FloatRange(min=0.1), default=10, show_default=True,
              help="How long to time the pipeline (after its first batch).")
@text_or_json_option
@pass_obj
def bench(obj: Context, job_file: str, local: bool, overrides, seconds: float, fmt: str):
    """Time the job's training input pipeline alone, as one host runs it: examples/s and MB/s.

    The pipeline is the one `train` runs, with the batch each input_fn call gets on the job's
    target (the TPU slice, or this machine with --local). When model_dir holds a run record of
    training, the rate is compared with what that training consumed per input pipeline: a pipeline
    that barely outruns it is what the steps waited for. Run it where training reads its input
    (the TPU VM or host) for a fair comparison.

    \b
    tpulaunch data bench job.yaml
    tpulaunch data bench job.yaml --local --seconds 30 --format json
    """
    from tpulaunch.app.data import bench as timed

    checked, result, comparison = timed(job_file, overrides, local=local, seconds=seconds, say=obj.say,
                                        warn=warnings_to(obj.err, job_file), verbose=obj.verbose,
                                        showing=obj.err.status)
    job = checked.job
    if fmt == "json":
        click.echo(json.dumps({"job": job.name, "model_dir": job.run.model_dir, "on_tpu": checked.plan.on_tpu,
                               **result.to_dict(),
                               "training": comparison.to_dict() if comparison else None}, indent=2))
        return
    _print_bench(obj, job, checked.plan, result, comparison)


def _print_bench(obj: Context, job, plan, result, comparison) -> None:
    from tpulaunch.data.input_help import input_help
    from tpulaunch.cli.render.run_text import format_rate

    def say(line: str) -> None:
        obj.out.print(line, highlight=False, markup=False, soft_wrap=True)

    target = f"TPU {job.tpu.type}" if plan.on_tpu else "this machine"
    which = f"1 of {result.input_pipelines} input pipelines" if result.input_pipelines > 1 else "the input pipeline"
    say(f"data bench | {job.name} | train input, {which} ({target}), batch {result.batch_size} | "
        f"{result.batches} batches in {result.seconds:.1f} s")
    say(f"{format_rate(result.examples_per_s)} examples/s | {result.mb_per_s:.1f} MB/s of decoded batches")
    if comparison is None:
        say(f"no training recorded in {job.run.model_dir} to compare with: after `tpulaunch train`, this "
            "compares the pipeline with the rate training needs")
        return
    verdict = ("training was likely input-bound" if comparison.input_bound
               else "it has headroom: input was not the bottleneck")
    say(f"training (run ended {comparison.run_end}) consumed {format_rate(comparison.needed_examples_per_s)} "
        f"examples/s per input pipeline; the pipeline alone delivers {comparison.ratio:.2f} x that; {verdict}")
    if comparison.input_bound:
        say("may help: " + "; ".join(input_help(job, on_tpu=plan.on_tpu)))
