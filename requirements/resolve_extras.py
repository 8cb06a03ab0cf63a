"""Resolves every extra of setup.cfg with pip's own resolver against the package index, on this Python, and
records what each resolved to in requirements/extras-resolved.json (name==version, with each package's own
requirements). tests/core/tpu/test_extras.py checks that record without the network: that it matches setup.cfg, that
every resolution is complete and consistent, and what the stack rule says of each.

    python requirements/resolve_extras.py          # after changing an extra in setup.cfg

An index page that could not be read (a proxy refusing it) is asked for again after a pause: pip would
otherwise resolve from what it has on disk and report a wrong answer or none.
"""

import configparser
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(ROOT, "requirements", "extras-resolved.json")
UNREACHABLE = ("ProxyError", "Cannot connect to proxy", "NewConnectionError", "Could not fetch URL",
               "Read timed out", "Temporary failure in name resolution")


def declared() -> dict:
    """setup.cfg's requirements: the core's and each extra's, as written (comments and blank lines dropped)."""
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))

    def lines(text: str) -> list:
        return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]

    return {"install_requires": lines(config["options"]["install_requires"]),
            "extras": {name: lines(text) for name, text in config["options.extras_require"].items()}}


def resolve(extra: str, tmp_dir: str) -> list:
    report = os.path.join(tmp_dir, f"{extra}.json")
    for pause in (0, 10, 30, 60, 120):
        time.sleep(pause)
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
                               "--retries", "2", "--timeout", "30", "--report", report, f".[{extra}]"],
                              cwd=ROOT, capture_output=True, text=True)
        unread = [line for line in done.stderr.splitlines() if any(sign in line for sign in UNREACHABLE)]
        if done.returncode == 0 and not unread:
            with open(report, encoding="utf-8") as file:
                return json.load(file)["install"]
        print(f"[{extra}] not resolved ({'index unread' if unread else 'pip failed'}); asking again", file=sys.stderr)
        if not unread:
            sys.exit(done.stderr[-3000:])
    sys.exit(f"[{extra}]: the package index could not be read")


def main() -> None:
    wanted = declared()
    packages, extras = {}, {}
    with tempfile.TemporaryDirectory() as tmp_dir:
        for extra in sorted(wanted["extras"]):
            print(f"resolving .[{extra}]", file=sys.stderr)
            pins = []
            for item in resolve(extra, tmp_dir):
                meta = item["metadata"]
                pin = f"{meta['name'].lower().replace('_', '-')}=={meta['version']}"
                pins.append(pin)
                if pin.startswith("tpulaunch=="):
                    continue  # this project: its requirements are setup.cfg's, recorded under "declared"
                packages[pin] = {"requires_dist": meta.get("requires_dist", []),
                                 "requires_python": meta.get("requires_python")}
            extras[extra] = sorted(pins)
    record = {"resolved_on": datetime.date.today().isoformat(),
              "python": platform.python_version(),
              "platform": f"{platform.system()} {platform.machine()}",
              "declared": wanted, "extras": extras, "packages": dict(sorted(packages.items()))}
    with open(RECORD, "w", encoding="utf-8") as file:
        json.dump(record, file, indent=1)
        file.write("\n")
    print(f"wrote {os.path.relpath(RECORD, ROOT)}: {len(extras)} extras, {len(packages)} packages", file=sys.stderr)


if __name__ == "__main__":
    main()
