#!/bin/bash
# The startup script of a TPU VM that `tpulaunch run` created (written from tpulaunch/remote/startup.sh).
# Every host of the slice runs it as root when it boots (a recreated VM too): it installs what the job needs,
# fetches tpulaunch from the stage and starts its host runner (tpulaunch/remote/host.py), which fetches the job
# and runs `tpulaunch train` with this host's role, its output kept under run.model_dir.
set -u
STAGE=@STAGE@                   # the stage's manifest, under run.model_dir
PACKAGE=@PACKAGE@               # tpulaunch itself, as staged
REHEARSAL_PYTHON=@PYTHON@       # a rehearsal: this machine's Python and its packages (empty on a TPU VM)
REQUIREMENTS=(@REQUIREMENTS@)   # tpulaunch's requirements with the engine's extra
BOOTED="$(date +%s.%N)"
META="${TPULAUNCH_METADATA_URL:-http://metadata.google.internal/computeMetadata/v1/}"
attribute() { curl -sSf -H "Metadata-Flavor: Google" "${META}instance/attributes/$1"; }
WORKER="$(attribute agent-worker-number)" || { echo "tpulaunch | no agent-worker-number in the metadata"; exit 1; }
ATTEMPT="$(attribute tpulaunch-attempt)" || ATTEMPT=1
DISK="${HOME:-/root}/tpulaunch"
mkdir -p "$DISK" && cd "$DISK" || exit 1
echo "tpulaunch | worker $WORKER of $(attribute accelerator-type) | VM $ATTEMPT of the run"
if [ -n "$REHEARSAL_PYTHON" ]; then
  PY="$REHEARSAL_PYTHON"
  echo "tpulaunch | a rehearsal: this machine's Python and its packages, nothing installed"
else
  # --system-site-packages: what the TPU image already has (its TensorFlow) is not installed twice
  python3 -m venv --system-site-packages "$DISK/venv" || exit 1
  "$DISK/venv/bin/python" -m pip install -q "${REQUIREMENTS[@]}" || { echo "tpulaunch | installing failed"; exit 1; }
  PY="$DISK/venv/bin/python"
fi
INSTALLED="$(date +%s.%N)"
"$PY" - "$PACKAGE" "$DISK/pkg" <<'FETCH' || { echo "tpulaunch | fetching tpulaunch from $PACKAGE failed"; exit 1; }
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
exec "$PY" -m tpulaunch.remote.host --stage "$STAGE" --worker "$WORKER" --attempt "$ATTEMPT" --disk "$DISK" \
  --booted "$BOOTED" --installed "$INSTALLED"
