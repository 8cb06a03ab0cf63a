"""`tpulaunch data`: write example TFRecords and look inside existing ones.

TensorFlow is imported only inside the commands (by tpulaunch.data.synth / tpulaunch.data.inspect_records).
"""

from __future__ import annotations

import json

import click

from tpulaunch.cli.app import Context, TpuLaunchGroup, consoles

EXAMPLE_NAMES = ("quickstart", "unet3d", "retinanet")
# Above this many records a progress bar is worth drawing.
PROGRESS_THRESHOLD = 200


class DataGroup(TpuLaunchGroup):
    """The main group's error handling (so `data` also runs on its own), without its lazy commands."""

    list_commands = click.Group.list_commands
    get_command = click.Group.get_command


@click.group(name="data", cls=DataGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def data(ctx: click.Context):
    """Write example TFRecords, or inspect TFRecords to declare them in a job.

    \b
    tpulaunch data synth --example quickstart data/quickstart
    tpulaunch data inspect 'gs://my-bucket/ct/train-*.tfrecord'
    """
    if ctx.obj is None:  # run on its own (not under `tpulaunch`): same consoles as the main CLI
        out, err = consoles()
        ctx.obj = Context(debug=False, verbose=0, out=out, err=err)


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
@click.pass_obj
def synth(obj: Context, name: str, out_dir: str, records, size, shards, seed: int):
    """Write synthetic train/eval TFRecords for the starter job --example into OUT_DIR (local or gs://).

    \b
    tpulaunch data synth --example quickstart data/quickstart
    tpulaunch data synth --example unet3d data/ct --size 32 --records 16
    tpulaunch data synth --example retinanet gs://my-bucket/detection --size 256
    """
    from tpulaunch.data import synth as synth_module

    total = synth_module.planned_records(name, records, shards)
    if total >= PROGRESS_THRESHOLD and obj.err.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(TextColumn("writing {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeRemainingColumn(), console=obj.err, transient=True) as progress:
            task = progress.add_task(name, total=total)
            files = synth_module.write_example(name, out_dir, records=records, shards=shards, seed=seed, size=size,
                                               on_record=lambda: progress.advance(task))
    else:
        with obj.err.status(f"writing {total} {name} records"):
            files = synth_module.write_example(name, out_dir, records=records, shards=shards, seed=seed, size=size)
    for path in files:
        obj.out.print(path, highlight=False, soft_wrap=True)
    obj.out.print(f"wrote {total} records in {len(files)} files", highlight=False)
    _print_next_step(obj, name, out_dir, size)


# The job in configs/ that each example's data is made for.
_EXAMPLE_JOBS = {"quickstart": "configs/quickstart.yaml", "unet3d": "configs/unet3d_ct.yaml",
                 "retinanet": "configs/retinanet_2560.yaml"}


def _print_next_step(obj: Context, name: str, out_dir: str, size) -> None:
    from tpulaunch.data.synth import template_overrides

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
@click.pass_obj
def inspect_command(obj: Context, pattern: str, records: int, compression, fmt: str):
    """Show what tf.train.Example records hold and print a `data.features:` block for the job file.

    \b
    tpulaunch data inspect data/quickstart/train-00000-of-00004.tfrecord
    tpulaunch data inspect 'gs://my-bucket/ct/train-*.tfrecord' --records 20
    tpulaunch data inspect 'data/*.tfrecord.gz' --compression GZIP --format json
    """
    from tpulaunch.data.inspect_records import inspect

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
