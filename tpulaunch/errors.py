"""Problems, exit codes and the one exception type the CLI turns into a clean message.

A *problem* is one located finding about a job (schema, partitioning, batch arithmetic, data, model).
Positions are 1-based, as editors and `file:line:col` consumers expect.
"""

from __future__ import annotations

import enum
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


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (TensorFlow's `.message` when it has one), else its type name.

    An error raised inside a tf.function's Python comes with autograph's "in user code:" and the frames
    first; its own message is the last line ("ValueError: Layer ... expects 2 input(s)"), without its type.
    An op that failed while a graph ran ("Graph execution error:") says what went wrong after the frames
    of the node's definition ("no features : Tensor had Inf values").
    """
    text = str(getattr(exc, "message", None) or exc).strip()
    if text.startswith("Graph execution error:"):  # the op's own message follows the frames of the node's definition
        said = [line.strip() for line in text.splitlines()
                if line.strip() and not line.startswith((" ", "\t")) and not line.startswith(
                    ("Graph execution error:", "Detected at node", "Node: ", "Detected unsupported operations"))]
        if said:
            return said[-1]
    if text.startswith("in user code:"):
        last = [line.strip() for line in text.splitlines() if line.strip()][-1]
        kind = f"{type(exc).__name__}: "
        return last[len(kind):] if last.startswith(kind) else last
    return text.splitlines()[0] if text else type(exc).__name__
