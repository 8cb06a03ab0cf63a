"""What a TPU VM's startup script (`startup.sh`) does in Python before anything is installed: `startup.py` writes
this file's text into the script, which runs it with the image's own python3, so it uses the standard library
alone (no gcloud, gsutil or google-cloud-storage on the image is assumed).

    python3 boot_tools.py put FILE URL                 a file to run.model_dir (a local folder, or gs://)
    python3 boot_tools.py wheelhouse-key REQUIREMENT...   the run's wheelhouse's name for these on this Python
    python3 boot_tools.py wheelhouse-get URL DIR       the wheelhouse at URL into DIR, checked by its hash
    python3 boot_tools.py wheelhouse-put DIR URL PINS REQUIREMENT...   DIR's wheels as the wheelhouse at URL
    python3 boot_tools.py report-pins REPORT           what `pip install --report REPORT` added, as pins

gs:// goes through Cloud Storage's JSON API with the token of the VM's service account from the metadata server
($TPULAUNCH_METADATA_URL, else Google's); $STORAGE_EMULATOR_HOST, as google-cloud-storage reads it, points it at
another server. Every file written is this user's alone, as every file under tpulaunch-remote/.

The wheelhouse (`layout.wheelhouse`): what the first host that installed the job's requirements from the package
index put into its venv, or over a container image's Python (a GKE pod: what pip's install report lists), as
wheels, so that every later host of the run (a recreated VM's, a restarted pod's) installs them with
`pip install --no-index --find-links`. It is named by the requirements and the Python's version and
machine (`wheelhouse-key`), and is two files: `<key>.tar` (the wheels) and `<key>.json` (written last: its hash,
size, the wheels and the pins they came from), so a reader sees a whole wheelhouse or none, and one whose tar does
not match its hash is not used.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

FORMAT = 1
ABSENT = 3  # wheelhouse-get's exit code when there is no wheelhouse (any other failure: 1)
CHUNK = 1 << 20


class Absent(Exception):
    """The object does not exist."""


# ------------------------------------------------------------------------------------------ run.model_dir

def _metadata_url() -> str:
    return os.environ.get("TPULAUNCH_METADATA_URL") or "http://metadata.google.internal/computeMetadata/v1/"


def _token() -> str:
    request = urllib.request.Request(_metadata_url() + "instance/service-accounts/default/token",
                                     headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)["access_token"]


def _gcs(url: str, *, upload: bool) -> str:
    """The JSON API's address for the object at gs:// `url`: its media upload, or its media download."""
    bucket, _, name = url[len("gs://"):].partition("/")
    endpoint = (os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com").rstrip("/")
    if upload:
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        return f"{endpoint}/upload/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o?{query}"
    return (f"{endpoint}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o/"
            f"{urllib.parse.quote(name, safe='')}?alt=media")


def _with_retries(url: str, doing: str, attempt_once):
    """`attempt_once()`, tried three times while Cloud Storage fails the way a retry may cure (5xx, 429, the
    network); a refusal (no such bucket, no permission) or Absent at once."""
    said = ""
    for attempt in range(3):
        try:
            return attempt_once()
        except urllib.error.HTTPError as refused:
            if refused.code == 404 and doing == "reading":
                raise Absent(url) from None
            said = f"HTTP {refused.code}: {refused.read()[:300].decode(errors='replace').strip()}"
            if refused.code < 500 and refused.code != 429:
                break
        except (OSError, ValueError, KeyError) as failed:
            said = str(failed) or type(failed).__name__
        if attempt < 2:
            time.sleep(2 ** attempt)
    raise OSError(f"cannot {'write' if doing == 'writing' else 'read'} {url}: {said}")


def put(path: str, url: str) -> None:
    """The file at `path` to `url`, whole (readers see the old object or the new one, never a part)."""
    if not url.startswith("gs://"):
        os.makedirs(os.path.dirname(url) or ".", exist_ok=True)
        temporary = f"{url}.tmp.{os.getpid()}"
        with open(path, "rb") as source, os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                                                   "wb") as target:
            shutil.copyfileobj(source, target, CHUNK)
        os.replace(temporary, url)
        return

    def once():
        with open(path, "rb") as data:  # streamed: a wheelhouse is gigabytes
            request = urllib.request.Request(_gcs(url, upload=True), data=data, method="POST", headers={
                "Authorization": f"Bearer {_token()}", "Content-Type": "application/octet-stream",
                "Content-Length": str(os.path.getsize(path))})
            with urllib.request.urlopen(request, timeout=600) as answer:
                answer.read()

    _with_retries(url, "writing", once)


def get(url: str, path: str) -> None:
    """The object at `url` into the file `path`; Absent when there is none."""
    if not url.startswith("gs://"):
        try:
            shutil.copyfile(url, path)
        except FileNotFoundError:
            raise Absent(url) from None
        return

    def once():
        request = urllib.request.Request(_gcs(url, upload=False), headers={"Authorization": f"Bearer {_token()}"})
        with urllib.request.urlopen(request, timeout=600) as answer, open(path, "wb") as target:
            shutil.copyfileobj(answer, target, CHUNK)

    _with_retries(url, "reading", once)


# ------------------------------------------------------------------------------------------ the wheelhouse

def wheelhouse_key(requirements) -> str:
    """The wheelhouse's name: the requirements (as staged) and what decides which wheels fit (this Python's version,
    this machine)."""
    what = {"format": FORMAT, "requirements": list(requirements), "python": "%d.%d" % sys.version_info[:2],
            "machine": platform.machine()}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def wheelhouse_put(folder: str, url: str, pins_file: str, requirements) -> dict:
    """The wheels in `folder` as the wheelhouse at `url` (`<url>.tar`, then `<url>.json`); what it wrote."""
    wheels = sorted(name for name in os.listdir(folder) if name.endswith(".whl"))
    with tempfile.TemporaryDirectory() as scratch:
        tar_path = os.path.join(scratch, "wheels.tar")
        with tarfile.open(tar_path, "w", format=tarfile.GNU_FORMAT) as tar:  # the same bytes for the same wheels
            for name in wheels:
                info = tar.gettarinfo(os.path.join(folder, name), arcname=name)
                info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
                with open(os.path.join(folder, name), "rb") as handle:
                    tar.addfile(info, handle)
        with open(pins_file) as handle:
            pins = [line.strip() for line in handle if line.strip() and not line.startswith("#")]
        described = {"format": FORMAT, "sha256": _sha256(tar_path), "bytes": os.path.getsize(tar_path),
                     "wheels": wheels, "pins": pins, "requirements": list(requirements),
                     "python": "%d.%d" % sys.version_info[:2], "machine": platform.machine(), "built": time.time()}
        put(tar_path, url + ".tar")
        json_path = os.path.join(scratch, "wheelhouse.json")
        with open(json_path, "w") as handle:
            json.dump(described, handle, indent=1)
        put(json_path, url + ".json")
    return described


def wheelhouse_get(url: str, folder: str) -> dict:
    """The wheelhouse at `url` unpacked into `folder`, its tar checked against its hash; Absent when there is none
    (no `.json`: none was built, or its build has not ended), ValueError when it does not match."""
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        json_path, tar_path = os.path.join(scratch, "wheelhouse.json"), os.path.join(scratch, "wheels.tar")
        get(url + ".json", json_path)
        with open(json_path) as handle:
            described = json.load(handle)
        get(url + ".tar", tar_path)
        found = _sha256(tar_path)
        if found != described["sha256"]:
            raise ValueError(f"{url}.tar does not match its hash (sha256 {found[:12]}, {url}.json says "
                             f"{described['sha256'][:12]})")
        with tarfile.open(tar_path) as tar:
            members = tar.getmembers()
            if any(os.path.basename(m.name) != m.name or not m.isfile() for m in members):
                raise ValueError(f"{url}.tar holds more than wheels")
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # where Python has it
            tar.extractall(folder, members=members, **safe)
    return described


def report_pins(report_file: str) -> list:
    """What a `pip install --report` added, pinned (`name==version`, one per distribution it installed)."""
    with open(report_file) as handle:
        report = json.load(handle)
    return [f"{item['metadata']['name']}=={item['metadata']['version']}" for item in report.get("install", [])]


def main(argv) -> int:
    command, args = argv[0], argv[1:]
    try:
        if command == "put":
            put(*args)
        elif command == "wheelhouse-key":
            print(wheelhouse_key(args))
        elif command == "wheelhouse-put":
            described = wheelhouse_put(args[0], args[1], args[2], args[3:])
            print(f"kept the run's wheelhouse: {len(described['wheels'])} wheels, {described['bytes']} bytes, "
                  f"at {args[1]}.tar")
        elif command == "report-pins":
            for pin in report_pins(args[0]):
                print(pin)
        elif command == "wheelhouse-get":
            described = wheelhouse_get(*args)
            print(f"the run's wheelhouse: {len(described['wheels'])} wheels, {described['bytes']} bytes, its hash "
                  f"checked, from {args[0]}.tar")
        else:
            print(f"boot_tools.py: no command {command}", file=sys.stderr)
            return 2
    except Absent as absent:
        print(f"none at {absent}", file=sys.stderr)
        return ABSENT
    except (OSError, ValueError, KeyError, tarfile.TarError) as failed:
        print(str(failed) or type(failed).__name__, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
