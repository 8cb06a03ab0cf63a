"""`tpulaunch status JOB.yaml`: is the job's TPU node there, READY, HEALTHY and of the declared type? Who
holds the lease on its model_dir (`run/lease.py`), and how did its last run end (its run record)?

No TensorFlow import: the installed version is read from package metadata; the lease and the record are read
through the store (`tpulaunch/store/`: local or gs://, each read within its timeout).
"""

from __future__ import annotations

import json

import click

from tpulaunch.cli.base import command, job_argument, pass_obj, set_option, text_or_json_option
from tpulaunch.errors import AlreadyReported, ExitCode, TpuLaunchError, first_line


@command()
@job_argument
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=0, show_default=True, metavar="SECONDS",
              help="Wait up to SECONDS for a CREATING/STARTING/REPAIRING/RESTARTING node to become READY and HEALTHY.")
@text_or_json_option
@set_option
@pass_obj
def status(obj, job_file, wait_s, fmt, overrides):
    """Show the job's TPU node: state, health, type, hosts, endpoints, runtime version; who holds the
    lease on run.model_dir (a live train/evaluate, a stale one, or none); and its last run (the newest
    whole line of its run record).

    The node comes from the job's tpu: section (name, zone, project), else $TPU_NAME,
    $TPU_ZONE, $TPU_PROJECT / $GOOGLE_CLOUD_PROJECT. Set $TPULAUNCH_TPU_DISCOVERY_URL to
    ask another TPU API endpoint (an emulator).

    Exit code 0 when the node can run the job, 3 when it cannot (not READY, not HEALTHY,
    another accelerator type, not found, API unreachable: said within $TPULAUNCH_TPU_API_REACH_S, 30 s by
    default), 1 for a job file mistake or a node whose runtime
    version does not run this machine's TensorFlow the job's engine's way (located at tpu.runtime_version,
    else tpu.name).

    \b
    Examples:
      tpulaunch status configs/unet3d_ct.yaml
      tpulaunch status job.yaml --wait 600          # wait while the node is CREATING
      tpulaunch status job.yaml --format json | jq .state
      tpulaunch status job.yaml --set tpu.name=my-other-tpu
    """
    from tpulaunch.cli.gate import load_checked
    from tpulaunch.tpu.node import check_node, resolve_node

    # Only the tpu: section decides whether the node can be asked about; other mistakes are validate's.
    checked = load_checked(job_file, overrides, verb="checking the TPU of", sections=("tpu",))
    lease = _lease(checked)
    last_run = _last_run(checked, obj)
    remote_run = _remote_run(checked, lease)
    job_tpu = checked.loaded.section("tpu")
    on_gke = checked.loaded.section("gke")
    if on_gke is not None:  # no TPU node of its own: the JobSet, and what its pods write to model_dir
        jobset = _jobset(checked, on_gke)
        if fmt == "json":
            click.echo(json.dumps({"file": job_file, "gke": jobset, "lease": lease, "last_run": last_run,
                                   "remote_run": remote_run}, indent=2, default=str))
        else:
            obj.out.print(f"GKE: {jobset['text']}", highlight=False, markup=False, soft_wrap=True)
            _print_lease(obj.out, lease)
            _print_last_run(obj.out, last_run)
            _print_remote_run(obj.out, remote_run)
        return
    if job_tpu is None:
        if fmt == "json":
            click.echo(json.dumps({"file": job_file, "tpu": None, "runs": "locally", "usable": True, "lease": lease,
                                   "last_run": last_run}, indent=2))
        else:
            obj.out.print(f"{job_file}: no tpu: section, so the job runs locally (CPU/GPU); nothing to check",
                          highlight=False)
            _print_lease(obj.out, lease)
            _print_last_run(obj.out, last_run)
        return

    from tpulaunch.checks.stack import refuse_unless_runnable

    refuse_unless_runnable(checked.loaded, job_file, "checking the TPU of")
    ref = resolve_node(job_tpu)
    spinner = None
    if fmt == "text" and wait_s and obj.err.is_terminal:
        spinner = obj.err.status(f"reading TPU node {ref.name}")
        spinner.start()

    def on_wait(node_status, seconds_left):
        message = (f"TPU node {ref.name} is {node_status.state}"
                   f"{'/' + node_status.health if node_status.health else ''}: waiting (up to {seconds_left:.0f}s more)")
        if spinner is not None:
            spinner.update(message)
        elif fmt == "text":
            obj.err.print(message, highlight=False)

    try:
        node = check_node(ref, job_tpu, wait=wait_s, on_wait=on_wait)
    finally:
        if spinner is not None:
            spinner.stop()
    from tpulaunch.checks.stack import node_problems

    # The node's runtime against this machine's TensorFlow and the job's engine: a job-file (or install)
    # problem, located, exit 1; it replaces the node's own looser major.minor warning.
    stack = node_problems(checked.loaded, ref.name, node.runtime_version)
    if stack:
        node.findings = [f for f in node.findings if f.code != "runtime-version-mismatch"]
    if fmt == "json":
        extra = {"problems": [p.to_dict() for p in stack]} if stack else {}
        click.echo(json.dumps({"file": job_file, **node.to_dict(), "lease": lease, "last_run": last_run,
                               "remote_run": remote_run, **extra}, indent=2))
    else:
        render_status(obj.out, node)
        _print_lease(obj.out, lease)
        _print_last_run(obj.out, last_run)
        _print_remote_run(obj.out, remote_run)
    if any(p.is_error for p in stack):
        if fmt == "json":  # the problems are in the JSON already
            raise AlreadyReported(ExitCode.PROBLEMS)
        raise TpuLaunchError(f"TPU node '{ref.name}' cannot run this job's TensorFlow: fix the problems above",
                             problems=stack, exit_code=ExitCode.PROBLEMS)
    if not node.usable:
        raise AlreadyReported(ExitCode.CLUSTER)


def _remote_run(checked, lease: dict) -> dict:
    """The newest `run`/`rehearse` under model_dir (its VM, hosts, step, checkpoint), or why it is unknown: not
    read where the lease could not be (the same store: its reason, without a second wait)."""
    from tpulaunch.remote.follow import run_summary, summary_text

    run = checked.loaded.section("run")
    if run is None:
        return {"text": "unknown (the job has no valid run.model_dir)"}
    if lease.get("state") == "unknown":
        return {"text": lease.get("text", "unknown")}
    try:
        summary = run_summary(run.model_dir)
    except Exception as exc:  # noqa: BLE001 — an unreachable bucket, no credentials: status still answers
        return {"text": f"unknown ({getattr(exc, 'message', None) or first_line(exc)})"}
    return {**(summary or {}), "text": summary_text(summary)}


def _print_remote_run(console, remote_run: dict) -> None:
    console.print(f"remote run: {remote_run['text']}", highlight=False, markup=False, soft_wrap=True)


def _jobset(checked, on_gke) -> dict:
    """The job's JobSet as the cluster has it: its state and restarts, or why it is unknown."""
    from tpulaunch.remote import gke

    name = gke.jobset.jobset_name(str(checked.loaded.data.get("name")))
    try:
        found = gke.read(name, on_gke)
    except TpuLaunchError as exc:
        return {"name": name, "state": "unknown", "text": f"JobSet '{name}': unknown ({exc.message})"}
    if found is None:
        return {"name": name, "state": "none", "text": f"JobSet '{name}': none in namespace '{on_gke.namespace}'"}
    state = gke.state_of(found)
    restarts = int((found.get("status") or {}).get("restarts") or 0)
    limit = found.get("spec", {}).get("failurePolicy", {}).get("maxRestarts")
    return {"name": name, "state": state, "restarts": restarts,
            "text": f"JobSet '{name}' ({on_gke.namespace}): {state} | {restarts} of at most {limit} restarts"}


def _lease(checked) -> dict:
    """{"model_dir", "state": held | stale | released | none | unknown, "holder": the lease as written,
    "renewed_s_ago", "text"} for run.model_dir; "unknown" (with why) when the job names none or it cannot be read."""
    import time

    from tpulaunch.run import lease as leases

    run = checked.loaded.section("run")
    model_dir = getattr(run, "model_dir", None)
    if not model_dir:
        return {"model_dir": None, "state": "unknown", "holder": None, "renewed_s_ago": None,
                "text": "unknown (the job has no valid run.model_dir)"}
    try:
        data = leases.read_lease(model_dir)
    except Exception as exc:  # a corrupt lease, an unreadable model_dir, no credentials for gs://
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {first_line(exc)}"
        return {"model_dir": model_dir, "state": "unknown", "holder": None, "renewed_s_ago": None,
                "text": f"unknown ({message})"}
    now = time.time()
    return {"model_dir": model_dir, "state": leases.lease_state(data, now), "holder": data,
            "renewed_s_ago": round(now - data["renewed"], 3) if data else None, "text": leases.describe(data, now)}


def _print_lease(console, lease: dict) -> None:
    where = f" ({lease['model_dir']})" if lease["model_dir"] else ""
    console.print(f"model_dir lease{where}: {lease['text']}", highlight=False, markup=False, soft_wrap=True)


def _last_run(checked, obj) -> dict:
    """{"state": "recorded" | "none" | "unknown", "record": the newest whole record (or None), "records": how many,
    "skipped": line numbers that are not whole records, "text"} from run.model_dir's run record. A torn line
    is skipped with a message on stderr; an unreadable record is "unknown" with why, never a failure of status."""
    from tpulaunch.run.record import RECORD_FILE, read_records, skipped_text

    run = checked.loaded.section("run")
    model_dir = getattr(run, "model_dir", None)
    empty = {"state": "unknown", "record": None, "records": 0, "skipped": []}
    if not model_dir:
        return {**empty, "text": "unknown (the job has no valid run.model_dir)"}
    path = f"{model_dir.rstrip('/')}/{RECORD_FILE}"
    try:
        text = _read_record_file(model_dir)
    except Exception as exc:  # an unreachable bucket, no credentials, an unreadable file
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {first_line(exc)}"
        return {**empty, "text": f"unknown ({message})"}
    if text is None:
        return {**empty, "state": "none", "text": "none (no run recorded yet)"}
    skipped = []
    records = read_records(text.splitlines(), on_skipped=lambda number, why: skipped.append((number, why)))
    if skipped:
        obj.err.print(skipped_text(path, skipped), highlight=False, markup=False, soft_wrap=True)
    if not records:
        return {**empty, "state": "none", "skipped": [n for n, _ in skipped], "text": "none (no whole record)"}
    last = records[-1]
    steps = last.get("steps") if isinstance(last.get("steps"), dict) else {}
    text = (f"{last.get('command')} {last.get('outcome')}, step {steps.get('from')} to {steps.get('to')}, "
            f"ended {last.get('end')}")
    return {"state": "recorded", "record": last, "records": len(records), "skipped": [n for n, _ in skipped],
            "text": text}


def _read_record_file(model_dir: str):
    """model_dir's run record as text (None when there is none), without TensorFlow: through the store, which
    answers a gs:// read within its timeout."""
    from tpulaunch import store
    from tpulaunch.run.record import RECORD_FILE

    found = store.read(f"{model_dir.rstrip('/')}/{RECORD_FILE}")
    return None if found is None else found.data.decode("utf-8", errors="replace")


def _print_last_run(console, last_run: dict) -> None:
    console.print(f"last run: {last_run['text']}", highlight=False, markup=False, soft_wrap=True)


def render_status(console, node) -> None:
    """A table of the node, then each finding with its hint."""
    from rich.markup import escape
    from rich.table import Table

    def mark(ok: bool, text: str) -> str:
        return f"[green]{escape(text)}[/]" if ok else f"[bold red]{escape(text)}[/]"

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("TPU", escape(node.name))
    if node.zone or node.project:
        table.add_row("zone / project", escape(f"{node.zone} / {node.project}"))
    if node.state is not None:
        table.add_row("state", mark(node.state == "READY", node.state))
        table.add_row("health", mark(node.health == "HEALTHY", node.health or "not reported"))
    type_text = node.accelerator_type or "unknown"
    if node.expected_type:
        same = node.accelerator_type in (None, node.expected_type)
        type_text = mark(same, type_text) + escape(f" (job: {node.expected_type})")
    else:
        type_text = escape(type_text)
    table.add_row("type", type_text)
    table.add_row("devices / hosts", escape(f"{node.devices if node.devices is not None else '?'} / {node.hosts}"))
    versions = f"{node.runtime_version or 'unknown'} (installed TensorFlow: {node.installed_tf or 'none'})"
    table.add_row("runtime", escape(versions))
    table.add_row("endpoints", escape(", ".join(node.endpoints) or "none"))
    if node.waited_s >= 1:
        table.add_row("waited", f"{node.waited_s:.0f}s")
    console.print(table)
    for finding in node.findings:
        colour = "bold red" if finding.severity == "error" else "yellow"
        console.print(f"[{colour}]{finding.severity}:[/] {escape(finding.message)}", highlight=False, soft_wrap=True)
        if finding.hint:
            console.print(f"  [cyan]hint:[/] {escape(finding.hint)}", highlight=False, soft_wrap=True)
    verdict = "[green]usable[/]" if node.usable else "[bold red]not usable[/]"
    console.print(f"TPU node {escape(node.name)}: {verdict}", highlight=False)
