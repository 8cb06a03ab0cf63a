#!/bin/bash
# The startup script of a TPU VM that `tpulaunch run` created (written from tpulaunch/remote/startup.sh).
# Every host of the slice runs it as root when it boots (a recreated VM too): it installs what the job needs,
# fetches tpulaunch from the stage and starts its host runner (tpulaunch/remote/host.py), which fetches the job
# and runs this host's part (`tpulaunch train`, or nothing), its output kept under run.model_dir.
# Until the host runner takes over, this script keeps the host's status (attempts/<n>/worker-<i>.json) itself:
# its phase, and when a step fails, what failed with the end of its output, so the controller names the host.
set -u
STAGE=@STAGE@                   # the stage's manifest, under run.model_dir
PACKAGE=@PACKAGE@               # tpulaunch itself, as staged
ATTEMPTS=@ATTEMPTS@             # run.model_dir/tpulaunch-remote/attempts: each VM's hosts' logs and statuses
WHEELHOUSE=@WHEELHOUSE@         # run.model_dir/tpulaunch-remote/wheelhouse: the requirements as wheels, once per run
REHEARSAL_PYTHON=@PYTHON@       # a rehearsal: this machine's Python and its packages (empty on a TPU VM)
REQUIREMENTS=(@REQUIREMENTS@)   # tpulaunch's requirements with the engine's extra
BOOTED="$(date +%s.%N)"
META="${TPULAUNCH_METADATA_URL:-http://metadata.google.internal/computeMetadata/v1/}"
SYSTEM_PYTHON="${REHEARSAL_PYTHON:-python3}"
attribute() { curl -sSf -H "Metadata-Flavor: Google" "${META}instance/attributes/$1"; }
if [ -n "${TPU_WORKER_ID:-}" ]; then
  # A GKE pod of the run's JobSet (remote/jobset.py): GKE gives the host's place in its slice, JobSet the slice's
  # index and its restart count; the run's hosts are numbered slice after slice, worker 0 of slice 0 the chief.
  WORKER=$(( ${TPULAUNCH_SLICE:-0} * ${TPULAUNCH_HOSTS_PER_SLICE:-1} + TPU_WORKER_ID ))
  ATTEMPT=$(( ${TPULAUNCH_ATTEMPT_BASE:-0} + ${TPULAUNCH_RESTART_ATTEMPT:-0} + 1 ))   # after model_dir's earlier runs
  ENDPOINTS="${TPULAUNCH_RUN_HOSTS:-${TPU_WORKER_HOSTNAMES:-}}"   # every slice's hosts
  ACCELERATOR="${TPU_ACCELERATOR_TYPE:-a GKE TPU slice}"
  ZONE=""
else
  WORKER="$(attribute agent-worker-number)" || { echo "tpulaunch | no agent-worker-number in the metadata"; exit 1; }
  ATTEMPT="$(attribute tpulaunch-attempt)" || ATTEMPT=1
  ENDPOINTS="$(attribute worker-network-endpoints)" || ENDPOINTS=""
  ACCELERATOR="$(attribute accelerator-type)" || ACCELERATOR=""
  ZONE="$(curl -sSf -H "Metadata-Flavor: Google" "${META}instance/zone")" || ZONE=""
  ZONE="${ZONE##*/}"            # projects/N/zones/Z: the zone the VM was made in (tpu.zones' fallback may pick any)
  # A slice of a multislice queued resource: Cloud TPU's tpu-env metadata (`KEY: 'value'` lines) names its slice,
  # the slices and the coordinator (tpulaunch/tpu/multislice.py); absent on one slice
  TPU_ENV="$(attribute tpu-env)" || TPU_ENV=""
  tpu_env() { printf '%s\n' "$TPU_ENV" | sed -n "s/^$1: *'\(.*\)' *\$/\1/p" | head -n 1; }
  SLICES="$(tpu_env MEGASCALE_NUM_SLICES)"
  SLICE="$(tpu_env MEGASCALE_SLICE_ID)"
  COORDINATOR="$(tpu_env MEGASCALE_COORDINATOR_ADDRESS)"
fi
HOSTS="$(echo "$ENDPOINTS" | tr ',' '\n' | grep -c .)"
[ "$HOSTS" -ge 1 ] || HOSTS=1
SLICES="${SLICES:-1}"
SLICE="${SLICE:-0}"
if [ "$SLICES" -gt 1 ]; then
  # The run's hosts are numbered slice after slice, as on GKE: worker 0 of slice 0 is the chief
  WORKER=$(( SLICE * HOSTS + WORKER ))
  HOSTS=$(( SLICES * HOSTS ))
fi
DISK="${HOME:-/root}/tpulaunch"
mkdir -p "$DISK" && cd "$DISK" || exit 1
LOG="$DISK/startup.log"          # what this script printed (also on its own output: the VM's console)
TOOLS="$DISK/boot_tools.py"      # what this script does in Python before anything is installed (stdlib alone)
cat >"$TOOLS" <<'BOOT_TOOLS'
@BOOT_TOOLS@
BOOT_TOOLS
say() { echo "tpulaunch | $*" | tee -a "$LOG"; }
# step PHASE WHAT COMMAND...: run it with its output kept in the log (written before it is read back); when it
# fails, the host's status says WHAT failed with the end of that output
step() {
  local phase="$1" what="$2"
  shift 2
  "$@" >"$DISK/step.out" 2>&1
  local code=$?
  tee -a "$LOG" <"$DISK/step.out"
  [ "$code" -eq 0 ] || fail "$phase" "$what"
}

# put FILE URL: a file to run.model_dir (a local folder in a rehearsal, else gs://, written with the VM's token in
# Python's standard library: a TPU image or a container's need not have gcloud or gsutil); fails saying why
put() { "$SYSTEM_PYTHON" "$TOOLS" put "$1" "$2"; }
# unreported WHAT: a failure that run.model_dir cannot carry (the host cannot write there), left where the
# controller reads it at once through the Cloud TPU API: the VM's guest attribute tpulaunch/failed (the node's
# metadata enables guest attributes); then stop. A GKE pod has none: its exit code tells the JobSet.
unreported() {
  say "worker $WORKER: $1"
  printf '%s' "$1" | head -c 2000 | curl -sS -X PUT --data-binary @- -H "Metadata-Flavor: Google" \
    "${META}instance/guest-attributes/tpulaunch/failed" >/dev/null 2>>"$LOG" \
    || say "worker $WORKER: could not leave that in the VM's guest attributes either"
  exit 1
}
# status PHASE [FAILED]: this host's status file; with FAILED, the step that failed and the end of its output.
# Not written: the host stops at once, saying why where the controller still reads it (`unreported`).
status() {
  "$SYSTEM_PYTHON" - "$WORKER" "$ATTEMPT" "$HOSTS" "$BOOTED" "$1" "${2:-}" "$LOG" >"$DISK/status.json" <<'STATUS'
import json, socket, sys, time
worker, attempt, hosts, booted, phase, failed, log = sys.argv[1:]
status = {"host": socket.gethostname(), "worker": int(worker), "attempt": int(attempt), "hosts": int(hosts),
          "booted": float(booted), "role": "startup", "phase": phase, "exit_code": None}
if failed:
    with open(log, errors="replace") as handle:
        tail = [line.rstrip() for line in handle if line.strip()][-20:]
    status.update(failed=failed, exit_code=1, ended=time.time(), log_tail=tail)
print(json.dumps(status, indent=1))
STATUS
  local why
  why="$(put "$DISK/status.json" "$ATTEMPTS/$ATTEMPT/worker-$WORKER.json" 2>&1)" \
    || unreported "${2:+$2; }this host cannot write its status to run.model_dir: ${why:-no reason given}"
}
# fail PHASE WHAT: say it, leave the log and then the status that points at it, stop. The log goes first: the
# controller removes the VM as soon as it reads a failed status, and this host with it.
fail() {
  say "worker $WORKER: $2"
  put "$LOG" "$ATTEMPTS/$ATTEMPT/worker-$WORKER.startup.log" 2>>"$LOG"
  status "$1" "$2"
  exit 1
}

# install_requirements KIND BASE_PYTHON: the job's requirements into $PY, from the package index once per run:
# worker 0 of the first VM (or pod) keeps what it installed (KIND venv: the venv's own distributions; image: what
# pip added to the image, from its install report) as wheels, as the run's wheelhouse under run.model_dir (named by
# the requirements and BASE_PYTHON's version); every later host, a recreated VM's or a restarted pod's too, installs
# from it, the index not asked. A wheelhouse missing, not matching its hash or not installing leaves a host to the
# index, as before.
install_requirements() {
  local kind="$1" base="$2" report=()
  export PIP_DISABLE_PIP_VERSION_CHECK=1  # its notice says nothing the run needs, and asks the index
  HOUSE="$WHEELHOUSE/$("$base" "$TOOLS" wheelhouse-key "${REQUIREMENTS[@]}")"
  WHEELS="$DISK/wheels"
  if "$base" "$TOOLS" wheelhouse-get "$HOUSE" "$WHEELS" >>"$LOG" 2>&1 \
      && "$PY" -m pip install -q --no-index --find-links "$WHEELS" "${REQUIREMENTS[@]}" >>"$LOG" 2>&1; then
    INSTALL_SOURCE=wheelhouse
    say "installed the job's requirements from the run's wheelhouse ($HOUSE.tar), none from the package index"
    return
  fi
  INSTALL_SOURCE=index
  # pip 22.2 and later report what an install added (an image's pip may be older: no wheelhouse then)
  if [ "$kind" = image ] && "$PY" -m pip install --help 2>/dev/null | grep -q -- "--report"; then
    rm -f "$DISK/installed.json"
    report=(--report "$DISK/installed.json")
  fi
  step installing "installing the job's requirements failed" \
    "$PY" -m pip install -q ${report[@]+"${report[@]}"} "${REQUIREMENTS[@]}"
  [ "$WORKER" = 0 ] || return 0
  # What was installed, pinned (a venv's: --all, so `wheel` too, which TensorFlow's dependencies need; not the pip
  # and setuptools every venv is made with), each as a wheel: pip's cache holds what it just downloaded (the index
  # serves its files as cacheable for a year), so the index is not asked for them again. Not keeping it fails
  # nothing: later hosts install from the index.
  if [ "$kind" = venv ]; then
    pins() { "$PY" -m pip freeze --local --all | { grep -v -E '^(pip|setuptools)==' || true; }; }
  elif [ ${#report[@]} -gt 0 ]; then
    pins() { "$base" "$TOOLS" report-pins "$DISK/installed.json"; }
  else
    say "this image's pip cannot report what it installed: later hosts install from the index"
    return 0
  fi
  if { rm -rf "$WHEELS" && mkdir -p "$WHEELS" && pins >"$DISK/pins.txt" \
      && { [ ! -s "$DISK/pins.txt" ] || "$PY" -m pip wheel -q --no-deps -w "$WHEELS" -r "$DISK/pins.txt"; } \
      && "$base" "$TOOLS" wheelhouse-put "$WHEELS" "$HOUSE" "$DISK/pins.txt" "${REQUIREMENTS[@]}"
    } >>"$LOG" 2>&1; then
    say "kept what it installed as the run's wheelhouse ($HOUSE.tar): later hosts install from it"
  else
    say "could not keep the run's wheelhouse (the end of $LOG says why): later hosts install from the index"
  fi
}

say "worker $WORKER of $HOSTS, $ACCELERATOR | VM $ATTEMPT of the run"
status installing
if [ -n "$REHEARSAL_PYTHON" ]; then
  PY="$REHEARSAL_PYTHON"
  say "a rehearsal: this machine's Python and its packages, nothing installed"
  # What the VM would install must be there already; $TPULAUNCH_REHEARSAL_REQUIRE adds one (the local VM sets it
  # to a missing package on the hosts told to fail their install).
  step installing "installing the job's requirements failed" \
    "$PY" - "${REQUIREMENTS[@]}" ${TPULAUNCH_REHEARSAL_REQUIRE:-} <<'CHECK'
import importlib.metadata, re, sys
missing = []
for requirement in sys.argv[1:]:
    name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
    marker = requirement.partition(";")[2].strip()
    if marker:
        try:
            from packaging.markers import Marker
            if not Marker(marker).evaluate():
                continue
        except ImportError:
            pass
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        missing.append(requirement)
for requirement in missing:
    print(f"ERROR: {requirement} is not installed in this machine's Python (a rehearsal installs nothing)")
sys.exit(1 if missing else 0)
CHECK
elif [ -n "${TPULAUNCH_IMAGE_PYTHON:-}" ]; then
  # A container image's own Python (a GKE pod): what the image has (its JAX and libtpu) is used, the rest installed
  # over it; pip's report of what it added is what the run's wheelhouse keeps
  PY="$TPULAUNCH_IMAGE_PYTHON"
  install_requirements image "$PY"
else
  # --system-site-packages: what the TPU image already has (its TensorFlow) is not installed twice. Ubuntu's Python
  # makes venvs only with its python3-venv package, which a base image need not have: installed then (as root).
  if ! python3 -m venv --system-site-packages "$DISK/venv" >>"$LOG" 2>&1; then
    rm -rf "$DISK/venv"
    say "python3 -m venv failed: installing Ubuntu's python3-venv"
    VENV_PACKAGE="python3.$(python3 -c 'import sys; print(sys.version_info[1])')-venv"
    step installing "installing $VENV_PACKAGE failed (python3 -m venv needs it)" \
      env DEBIAN_FRONTEND=noninteractive bash -c "apt-get update -q && apt-get install -y -q $VENV_PACKAGE"
    step installing "making the venv failed" python3 -m venv --system-site-packages "$DISK/venv"
  fi
  PY="$DISK/venv/bin/python"
  install_requirements venv python3
fi
INSTALLED="$(date +%s.%N)"
status fetching
step fetching "fetching tpulaunch from $PACKAGE failed" "$PY" - "$PACKAGE" "$DISK/pkg" <<'FETCH'
import io, sys, tarfile
url, into = sys.argv[1], sys.argv[2]
if url.startswith("gs://"):
    from google.cloud import storage
    bucket, _, name = url[len("gs://"):].partition("/")
    data = storage.Client().bucket(bucket).blob(name).download_as_bytes()
else:
    with open(url, "rb") as handle:
        data = handle.read()
tarfile.open(fileobj=io.BytesIO(data)).extractall(into)
FETCH
export PYTHONPATH="$DISK/pkg"
# A stop for this script (a GKE pod's SIGTERM reaches only its first process) goes on to the host runner, which
# passes it to train: train saves its checkpoint and ends, as on a TPU VM shutting down.
"$PY" -m tpulaunch.remote.host --stage "$STAGE" --worker "$WORKER" --hosts "$HOSTS" --endpoints "$ENDPOINTS" --zone "$ZONE" \
  --slice "$SLICE" --slices "$SLICES" --coordinator "${COORDINATOR:-}" \
  --attempt "$ATTEMPT" --disk "$DISK" --booted "$BOOTED" --installed "$INSTALLED" \
  --installed-from "${INSTALL_SOURCE:-}" > >(tee -a "$LOG") 2>&1 &
RUNNER=$!
trap 'kill -TERM "$RUNNER" 2>/dev/null' TERM
trap 'kill -INT "$RUNNER" 2>/dev/null' INT
wait "$RUNNER"
CODE=$?
while kill -0 "$RUNNER" 2>/dev/null; do  # the wait a trapped signal cut short: wait for the runner's own end
  wait "$RUNNER"
  CODE=$?
done
# The host runner keeps the status from its start (and a copy on this disk); one that failed before writing it
# (the stage unreadable, model_dir not writable by it) fails the startup here, with its output: a new VM would
# fail the same way. Killed by a signal (the VM going down) is not such a failure: the controller sees the VM.
if [ "$CODE" -ge 1 ] && [ "$CODE" -le 127 ] && grep -q '"role": "startup"' "$DISK/status.json" 2>/dev/null; then
  fail fetching "the host runner stopped (exit code $CODE) before it started this host's part"
fi
[ "$CODE" -eq 0 ] || put "$LOG" "$ATTEMPTS/$ATTEMPT/worker-$WORKER.startup.log" 2>>"$LOG"
exit "$CODE"
