"""model_dir as every engine uses it: the latest checkpoint's step, the job copy, the checkpoint state
repaired after a cut-off save, and a model_dir that cannot be written said as one clear message.

TensorFlow's filesystem throughout (model_dir may be gs://); TensorFlow is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import TYPE_CHECKING, Callable, Optional

from tpulaunch.errors import TpuLaunchError, first_line, storage_error
from tpulaunch.job.document import job_document
from tpulaunch.job.yamlfile import value_at
from tpulaunch.job.schema import Job

if TYPE_CHECKING:
    from tpulaunch.run.events import RunRecorder

JOB_COPY = "tpulaunch-job.yaml"
"""The resolved job, written into model_dir by `train` (its secrets masked: `job/secrets.py`), mode 0600."""
# TPUEstimator's name-based checkpoints, or the keras engine's object-based ones (tf.train.Checkpoint).
STEP_KEYS = ("global_step", "global_step/.ATTRIBUTES/VARIABLE_VALUE")

# Sections of the job that define what a checkpoint contains: resuming with other values would
# restore variables into a different model or feed it different tensors.
_IDENTITY = (("model",), ("data", "features"), ("data", "labels"))


def checkpoint_step(model_dir: str) -> Optional[int]:
    """The global step of the latest checkpoint in `model_dir`, or None when there is none."""
    import tensorflow as tf

    path = tf.train.latest_checkpoint(model_dir)
    if not path:
        return None
    reader = tf.train.load_checkpoint(path)
    for key in STEP_KEYS:
        if reader.has_tensor(key):
            return int(reader.get_tensor(key))
    return None


def checkpoint_to_read(model_dir: str, checkpoint: Optional[str], verb: str, say: Callable[[str], None]) -> str:
    """The checkpoint `evaluate` or `export` (`verb`) reads: `checkpoint` (--checkpoint) once it is complete, else
    model_dir's newest complete one, whatever the state file names; `say` is told which one and why when a newer
    one was skipped.

    Raises:
        TpuLaunchError: no checkpoint at all, a damaged --checkpoint (named), or checkpoint files none of which can be
            restored (named; exit 1, never a traceback).
    """
    from tpulaunch.engine.core.checkpoints import readable_checkpoint

    readable = readable_checkpoint(model_dir, checkpoint, "evaluating" if verb == "evaluate" else "exporting")
    if readable is None:
        raise TpuLaunchError(f"no checkpoint in {model_dir} to {verb}", hint="train first, or pass --checkpoint PATH")
    for line in readable.lines:
        say(line)
    return readable.path


def write_job_copy(job: Job, model_dir: str, *, force: bool = False) -> str:
    """Write the resolved job into model_dir, after checking it matches the one already there.

    Raises:
        TpuLaunchError: model_dir holds checkpoints of a job with another model or data spec
            (unless `force`).
    """
    import tensorflow as tf
    import yaml

    path = os.path.join(model_dir, JOB_COPY)
    document = job_document(job)
    if not force and tf.io.gfile.exists(path) and checkpoint_step(model_dir) is not None:
        with tf.io.gfile.GFile(path) as handle:
            previous = yaml.safe_load(handle.read()) or {}
        changed = [".".join(keys) for keys in _IDENTITY if value_at(previous, keys) != value_at(document, keys)]
        if changed:
            raise TpuLaunchError(
                f"{model_dir} holds checkpoints of a job with a different {', '.join(changed)}",
                hint=f"compare with {path}; use another run.model_dir (or --model-dir), or pass --force to "
                     "resume anyway")
    tf.io.gfile.makedirs(model_dir)
    # Written whole, then renamed over the copy: a full disk mid-write leaves the previous copy, not half of one
    # (which the next resume would read as a job with another model), and no temporary file.
    temporary = path + ".tmp"
    try:
        if "://" not in temporary:  # readable by this user alone, from its first byte: it holds the job's values
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.fchmod(fd, 0o600)  # a temporary left by a cut-off write keeps its mode otherwise
            os.close(fd)
        with tf.io.gfile.GFile(temporary, "w") as handle:
            handle.write(yaml.safe_dump(document, sort_keys=False))
        tf.io.gfile.rename(temporary, path, overwrite=True)
    except BaseException:
        with contextlib.suppress(Exception):
            tf.io.gfile.remove(temporary)
        raise
    return path


@contextlib.contextmanager
def model_dir_errors(model_dir: str):
    """A model_dir that cannot be written (full disk, permissions, not a directory, removed mid-run)
    becomes one clear message naming it; the last complete checkpoint stays where it is."""
    import tensorflow as tf

    try:
        yield
    except (tf.errors.FailedPreconditionError, tf.errors.ResourceExhaustedError, tf.errors.NotFoundError,
            tf.errors.PermissionDeniedError, OSError, ValueError) as exc:
        # ValueError: the Saver's own check (saver.py) "Parent directory of ... doesn't exist, can't save."
        if isinstance(exc, ValueError) and "can't save" not in str(exc):
            raise
        if not _about(model_dir, str(getattr(exc, "message", None) or exc)):
            raise  # not about model_dir (an out-of-memory, a data file): let its own handler speak
        storage = storage_error(exc)
        if storage is not None and storage.path:
            _remove_failed_save(model_dir, storage.path)
        try:
            step = checkpoint_step(model_dir)
        except Exception:  # the directory may be gone
            step = None
        resume = f"; a rerun resumes from step {step}" if step else ""
        if storage is not None:  # a full disk, a quota, a read-only filesystem, permissions: said as such
            raise TpuLaunchError(f"run.model_dir {model_dir}: {storage.text()}", hint=f"{storage.hint}{resume}",
                                 code=storage.name.lower()) from None
        raise TpuLaunchError(f"run.model_dir {model_dir}: {first_line(exc)}",
                             hint=f"recreate the directory, free disk space or fix its permissions{resume}") from None


def _remove_failed_save(model_dir: str, path: str) -> None:
    """Remove what a save that failed writing `path` left in model_dir: TensorFlow's `model.ckpt-N_temp` folder
    (a sharded save writes there, then renames) or its `checkpoint.tmp<hex>` (the state file is written to a
    temporary name, then renamed). Left behind they are only debris, never a checkpoint to resume from."""
    import tensorflow as tf

    match = re.match(re.escape(model_dir.rstrip("/")) + r"/(model\.ckpt-\d+_temp|checkpoint\.tmp[0-9a-f]{32})(?:/|$)",
                     path)
    if match:
        debris = os.path.join(model_dir, match.group(1))
        with contextlib.suppress(Exception):  # best effort: the error itself is what the user must see
            if tf.io.gfile.isdir(debris):
                tf.io.gfile.rmtree(debris)
            else:
                tf.io.gfile.remove(debris)


def _about(model_dir: str, text: str) -> bool:
    """Whether an error message names model_dir, a file in it, or a directory above it."""
    if "No space left" in text or "Disk quota exceeded" in text:
        return True
    for path in re.findall(r"(?:gs://|/)[^\s'\";,]+", text):
        path = path.rstrip(".")
        if path.startswith(model_dir) or model_dir.startswith(path.rstrip("/") + "/"):
            return True
    return False


def repair_checkpoints(model_dir: str, recorder: "RunRecorder"):
    """Point the checkpoint state at the newest complete checkpoint, saying what was skipped, and remove what
    saves that never finished left in staging (called by the run that holds model_dir's lease)."""
    from tpulaunch.engine.core.checkpoints import describe_repair, repair_checkpoint_state
    from tpulaunch.engine.core.staged_save import sweep_staging

    sweep_staging(model_dir)
    repair = repair_checkpoint_state(model_dir)
    for line in describe_repair(repair):
        recorder.note(line)
    return repair
