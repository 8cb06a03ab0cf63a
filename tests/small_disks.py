"""Real disks that fail a write, for the tests: a small tmpfs (full after a few KiB) or a read-only one where this
machine lets the test mount one (root, in a container allowed to mount), else a directory made read-only with
chmod for a user that is not root (root writes through any mode bits). Where neither is possible the test
fails with the reason (the machines this suite runs on run it as root, allowed to mount), never faked."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest


@contextlib.contextmanager
def tmpfs(mount_point: Path, size: str = "16k", read_only: bool = False) -> Iterator[str]:
    """A tmpfs of `size` mounted at `mount_point` (read-only when asked) while the block runs; skips when this
    machine refuses the mount (failing, with the reason)."""
    mount_point.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root here")
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.fail(f"this machine refuses to mount a tmpfs ({mounted.stderr.strip() or mounted.returncode})")
    try:
        yield str(mount_point)
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@contextlib.contextmanager
def read_only_dir(where: Path) -> Iterator[tuple]:
    """(a directory no write into succeeds, the errno name a write gets there: "EROFS" or "EACCES")."""
    if os.geteuid() != 0:
        where.mkdir(parents=True, exist_ok=True)
        where.chmod(0o555)
        try:
            yield str(where), "EACCES"
        finally:
            where.chmod(0o755)
        return
    with tmpfs(where, size="64k", read_only=True) as path:
        yield path, "EROFS"
