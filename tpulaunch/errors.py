"""Problems, exit codes and the one exception type the CLI turns into a clean message.

A *problem* is one located finding about a job (schema, partitioning, batch arithmetic, data, model).
Positions are 1-based, as editors and `file:line:col` consumers expect.
"""

from __future__ import annotations

import enum
import errno
import re
import resource  # here, not where a limit is read: with every file descriptor taken, no module can be imported
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

DOCUMENT_PATH = "(file)"
"""The path of a problem about the whole file (unreadable, not YAML, empty) rather than one key."""


class ExitCode(enum.IntEnum):
    """Process exit codes, mapped in one place (cli/base.py)."""

    OK = 0
    PROBLEMS = 1  # the job (or a run) has errors the user must fix
    USAGE = 2  # bad command line
    CLUSTER = 3  # the TPU could not be reached or is not usable
    NO_CAPACITY = 4  # no TPU to be had now: a stockout or no quota (RESOURCE_EXHAUSTED); retry later or elsewhere
    LEASE_LOST = 5  # another run took model_dir's lease over: this run stopped writing there (fenced)
    INTERNAL = 70  # an unexpected error: a fault in tpulaunch or a library it called (sysexits' EX_SOFTWARE)
    HANGUP = 129  # SIGHUP (the terminal or SSH session closed), handled as SIGTERM: checkpoint saved
    INTERRUPTED = 130  # Ctrl-C (SIGINT), checkpoint saved
    TERMINATED = 143  # SIGTERM, checkpoint saved


@dataclass(frozen=True)
class Location:
    file: str
    line: int = 1
    column: int = 1

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True)
class Problem:
    """One finding, in the shape `validate --format json` prints."""

    severity: str  # "error" | "warning"
    file: str
    line: int
    column: int
    path: str  # dotted path in the job file, e.g. "partition.features.image"
    code: str  # kebab-case slug, stable: tools match on it
    message: str
    hint: Optional[str] = None

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    @property
    def location(self) -> Location:
        return Location(self.file, self.line, self.column)

    def to_dict(self) -> dict:
        return asdict(self)

    def with_severity(self, severity: str) -> "Problem":
        return replace(self, severity=severity)


class TpuLaunchError(Exception):
    """An error for the user: printed as a message (plus problems and a hint), never a traceback."""

    exit_code: ExitCode = ExitCode.PROBLEMS
    # How the CLI prints the message: "error" (with that prefix), "plain" (as is: a run that stopped),
    # or "" (only when there are no problems: the problems say it all).
    show_message: str = "error"

    def __init__(
        self,
        message: str,
        *,
        hint: Optional[str] = None,
        problems: Optional[list[Problem]] = None,
        exit_code: Optional[ExitCode] = None,
        code: Optional[str] = None,
    ):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.code = code  # the problem code validate reports this under, when it has its own
        self.problems = list(problems or [])
        if exit_code is not None:
            self.exit_code = exit_code


class JobFileError(TpuLaunchError):
    """The job file cannot be read or parsed at all; `problems` says where."""

    show_message = ""


class AlreadyReported(TpuLaunchError):
    """The command has printed its own report (validate's verdict, a node's status); only the exit code is left."""

    def __init__(self, exit_code: ExitCode = ExitCode.PROBLEMS):
        super().__init__("", exit_code=exit_code)


@dataclass
class ProblemList:
    """Problems collected while checking a job, kept in the order found."""

    items: list[Problem] = field(default_factory=list)

    def add(self, problem: Problem) -> None:
        if problem not in self.items:
            self.items.append(problem)

    def extend(self, problems) -> None:
        for p in problems:
            self.add(p)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.items if p.is_error]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.items if not p.is_error]

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def is_graph_error(exc: BaseException) -> bool:
    """Whether TensorFlow raised it for an op of a graph that ran (an assertion, a NaN check, data a shape
    did not fit): the job's computation failed, which the job's code or data must fix. Told by class name,
    so that the CLI need not import TensorFlow to tell."""
    return any(cls.__name__ == "OpError" and cls.__module__.startswith("tensorflow.") for cls in type(exc).__mro__)


# TensorFlow appends this to every ResourceExhaustedError, a full disk's included: never the message to show.
_OOM_HINT = "Hint: If you want to see a list of allocated tensors when OOM happens"


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (TensorFlow's `.message` when it has one), else its type name.

    An error raised inside a tf.function's Python comes with autograph's "in user code:" and the frames
    first; its own message is the last line ("ValueError: Layer ... expects 2 input(s)"), without its type.
    An op that failed while a graph ran ("Graph execution error:") says what went wrong after the frames
    of the node's definition ("no features : Tensor had Inf values"), in its first line: what follows
    (`Registered kernels:`, `[[node]]`) is TensorFlow's detail.
    """
    text = str(getattr(exc, "message", None) or exc).strip()
    if text.startswith("Graph execution error:"):  # the op's own message follows the frames of the node's definition
        lines = text.splitlines()
        nodes = [i for i, line in enumerate(lines) if line.startswith("Node: ")]
        after = lines[nodes[-1] + 1:] if nodes else lines
        said = [line.strip() for line in after
                if line.strip() and not line.startswith((" ", "\t")) and not line.startswith(
                    ("Graph execution error:", "Detected at node", "Node: ", "Detected unsupported operations",
                     _OOM_HINT))]
        said = [line for line in said if not _FOLLOWS_TENSORFLOWS_MESSAGE.match(line)]
        if said:
            return said[0]
    if text.startswith("in user code:"):
        last = [line.strip() for line in text.splitlines() if line.strip()][-1]
        kind = f"{type(exc).__name__}: "
        return last[len(kind):] if last.startswith(kind) else last
    said = [line.strip() for line in text.splitlines() if line.strip()]
    return next((line for line in said if not _FOLLOWS_TENSORFLOWS_MESSAGE.match(line)), said[0]) if said else \
        type(exc).__name__


# Lines TensorFlow writes after an op's own message (the kernels it looked for, the node, the op, the call stack):
# never the line that says what is wrong.
_FOLLOWS_TENSORFLOWS_MESSAGE = re.compile(
    r"^(Registered (devices|kernels):|<no registered kernels>|device='|\[\[|\{\{function_node|Op:|"
    r"Call context:|Stack trace|\[Op:)")


# Why a write to a disk (or a mounted bucket) failed, by errno and by the words of its message (TensorFlow's
# status text carries strerror's words, not the errno): (errno name, what it means, what to do).
_STORAGE_ERRORS = (
    (errno.ENOSPC, "No space left on device", "no space left on device",
     "free space on the disk that holds it (`df -h`), or use another run.model_dir"),
    (errno.EDQUOT, "Disk quota exceeded", "disk quota exceeded",
     "free space within your quota (`quota -s`), or use another run.model_dir"),
    (errno.EROFS, "Read-only file system", "read-only file system",
     "the filesystem is mounted read-only: use another run.model_dir (or --model-dir)"),
    (errno.EACCES, "Permission denied", "permission denied",
     "this user may not write there: fix its permissions (`ls -ld`), or use another run.model_dir"),
)
_PATH = re.compile(r"(?:gs://|/)[^\s'\";,]+")


@dataclass(frozen=True)
class StorageError:
    """A write that failed for want of space or permission: which (errno name), on what path, what to do."""

    name: str  # "ENOSPC"
    said: str  # "no space left on device"
    path: Optional[str]
    hint: str

    def text(self) -> str:
        return f"{self.said} ({self.name})" + (f": {self.path}" if self.path else "")


def storage_error(exc: BaseException) -> Optional[StorageError]:
    """The disk or permission failure `exc` is (an OSError, or TensorFlow's error for one: a full disk comes as
    a ResourceExhaustedError, which is not an out-of-memory), or None."""
    text = str(getattr(exc, "message", None) or exc)
    number = getattr(exc, "errno", None) if isinstance(exc, OSError) else None
    for code, words, said, hint in _STORAGE_ERRORS:
        if number == code or (number is None and words in text):
            path = getattr(exc, "filename", None) if number is not None else None
            if path is None:  # TensorFlow's "<path>; No space left on device", or a path elsewhere in the text
                before = text[:text.find(words)] if words in text else text
                paths = _PATH.findall(before) or _PATH.findall(text)
                path = paths[-1].rstrip(".:") if paths else None
            return StorageError(errno.errorcode[code], said, str(path) if path is not None else None, hint)
    return None


# ------------------------------------------------------------------------------------------- resource limits

# Out of host memory, as Python, the C++ runtime, TensorFlow, XLA and the dynamic loader say it. Under an address-space
# limit (`ulimit -v`) each of them fails this way: mapping a framework's library at import, protobuf's descriptor
# pool, a thread's stack, a tensor's allocation.
_OUT_OF_MEMORY = ("std::bad_alloc", "OOM when allocating", "Out of memory", "out of memory",
                  "failed to map segment from shared object", "Cannot allocate memory", "can't start new thread",
                  "cannot allocate memory")
# ... but not a device's (a TPU's HBM, a GPU's): no host limit is involved there.
_DEVICE_MEMORY = ("hbm", "HBM", "device:GPU", "device:TPU", "GPU memory", "TPU memory")
_TOO_MANY_FILES = "Too many open files"


class ResourceLimitError(TpuLaunchError):
    """A failure for want of a resource this process is limited in: host memory (its address space, `ulimit -v`)
    or open files (`ulimit -n`), with the limit's current value and the fix."""


def resource_limit_error(exc: BaseException) -> Optional[ResourceLimitError]:
    """The error to show for `exc` when it failed for want of host memory or file descriptors, else None.

    Told by type (MemoryError), errno (ENOMEM, EMFILE) or the words of its message or of an error it was raised
    from (an ImportError of a library the loader could not map; TensorFlow's and XLA's RESOURCE_EXHAUSTED)."""
    if storage_error(exc) is not None:  # a full disk also comes as RESOURCE_EXHAUSTED
        return None
    texts, cause, seen = [], exc, 0
    while cause is not None and seen < 8:  # the error and what it was raised from
        texts.append(f"{type(cause).__name__}: {getattr(cause, 'message', None) or cause}")
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    text = "\n".join(texts)
    said = f"{type(exc).__name__}: {first_line(exc)}" if str(exc).strip() else type(exc).__name__
    number = getattr(exc, "errno", None) if isinstance(exc, OSError) else None
    if number in (errno.EMFILE, errno.ENFILE) or _TOO_MANY_FILES in text:
        return ResourceLimitError(f"too many open files ({_files_limit()}): {said}",
                                  hint=f"raise the limit before running (ulimit -n {_more_files()}); or name fewer, "
                                       "larger data files")
    limit = _memory_limit()
    memory = (isinstance(exc, MemoryError) or number == errno.ENOMEM
              or any(words in text for words in _OUT_OF_MEMORY)
              # A C extension that fails without saying why, under a memory limit: an allocation it did not check.
              or (limit is not None and isinstance(exc, SystemError)))
    if not memory or any(words in text for words in _DEVICE_MEMORY):
        return None
    if limit is None:
        return ResourceLimitError(
            f"out of host memory (no ulimit -v or -d limit on this process: the machine's memory ran out): {said}",
            hint="a smaller train.batch_size (or eval.batch_size), a smaller model, or a machine with more memory")
    return ResourceLimitError(
        f"out of memory under this process's {limit[0]}: {said}",
        hint=f"raise the limit before running ({limit[1]} unlimited, or well above {_size(limit[2])}); TensorFlow and "
             "JAX reserve far more address space than they use; or a smaller train.batch_size (or model)")


def _memory_limit() -> Optional[tuple]:
    """(what the limit is, with its value; the ulimit option; bytes) of this process's memory limit, or None."""
    for name, option, what in (("RLIMIT_AS", "ulimit -v", "address-space limit"),
                               ("RLIMIT_DATA", "ulimit -d", "data-segment limit")):
        soft, _hard = resource.getrlimit(getattr(resource, name))
        if soft != resource.RLIM_INFINITY:
            return f"{what} of {_size(soft)} ({option} {soft // 1024})", option, soft
    return None


# Below this much address space TensorFlow and XLA may fail to start a thread, which ends the process natively
# (std::terminate, SIGABRT): no Python runs then, so no record line is written (seen at 1.5 and 3 GiB, not at 8).
NATIVE_ABORT_BELOW = 8 * 2 ** 30


def low_memory_limit_warning() -> Optional[str]:
    """A warning for a memory limit so low that the framework may abort natively, with the fix; None otherwise."""
    limit = _memory_limit()
    if limit is None or limit[2] >= NATIVE_ABORT_BELOW:
        return None
    return (f"this process runs under an {limit[0]}: TensorFlow and XLA may then fail to start a thread and abort "
            "natively, leaving no run record (the next run takes the lease over at once); raise it "
            f"({limit[1]} unlimited), or run the job with less memory: a smaller batch or model")


def _size(size: int) -> str:
    return f"{size / 2 ** 30:.1f} GiB" if size >= 2 ** 30 else f"{size / 2 ** 20:.0f} MiB"


def _files_limit() -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    return f"this process may open {soft} (ulimit -n {soft}; its hard limit is {hard_text})"


def _more_files() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max(4096, soft * 4)
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


# What libtpu and TensorFlow say when the host's TPU chips are not there or another process holds them: an
# infrastructure failure (a host without its TPU, a leftover process), which `run` recovers from on both targets.
_TPU_UNAVAILABLE = re.compile(
    r"TPU initialization failed|Cannot find any TPU cores|No \w+ device found|TPU is already in use by process"
    r"|Couldn't open device: /dev/(?:accel|vfio)")


def tpu_unavailable(exc: BaseException) -> Optional[str]:
    """The first line of an error that says this host's TPU chips cannot be found or opened, or None."""
    text = str(getattr(exc, "message", None) or exc)
    return first_line(exc) if _TPU_UNAVAILABLE.search(text) else None
