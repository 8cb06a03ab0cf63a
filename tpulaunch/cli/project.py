"""`tpulaunch schema` and `tpulaunch init`: the job file's JSON Schema and commented starter jobs."""

from __future__ import annotations

import os

import click

from tpulaunch.cli.base import Context, command, pass_obj
from tpulaunch.errors import TpuLaunchError


@command()
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), help="Write to a file instead of stdout.")
def schema(output):
    """Print the job file's JSON Schema (for editor completion and checks).

    \b
    Point your editor at it with a first line in the job file:
      # yaml-language-server: $schema=./tpulaunch.schema.json
    after: tpulaunch schema -o tpulaunch.schema.json
    """
    import json

    from tpulaunch.job.schema import json_schema

    text = json.dumps(json_schema(), indent=2)
    if output:
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    else:
        click.echo(text)


@command()
@click.argument("path", required=False, type=click.Path(dir_okay=False))
@click.option("--example", type=click.Choice(["quickstart", "unet3d", "retinanet"]), default="quickstart", show_default=True,
              help="Which starter job to write.")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@pass_obj
def init(obj: Context, path, example, force):
    """Write a commented starter job file (default: <example>.yaml).

    \b
    Examples:
      tpulaunch init                       # quickstart.yaml: runs on this machine's CPU
      tpulaunch init --example unet3d ct.yaml
    """
    from tpulaunch.cli.templates import template_text

    path = path or f"{example}.yaml"
    if os.path.exists(path) and not force:
        raise TpuLaunchError(f"{path} exists", hint="pass --force to overwrite, or name another file")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(template_text(example))
    if example == "quickstart":
        step = (f"tpulaunch data synth --example quickstart {os.path.join(os.path.dirname(path), 'data', 'quickstart')}"
                f" && tpulaunch validate {path} && tpulaunch train {path}")
    else:
        step = f"tpulaunch validate {path} --static && tpulaunch plan {path}"
    obj.out.print(f"wrote {path}; next: {step}", highlight=False, soft_wrap=True)
