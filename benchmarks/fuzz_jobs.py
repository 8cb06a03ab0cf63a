"""Property-based fuzzing of job files and --set overrides: no input makes `validate --static` crash.

Cases start from the valid jobs (tests/jobs/good/*.yaml and the starter templates) and are mutated
structurally (keys dropped, renamed, retyped, nested wrongly; out-of-range, huge and non-finite
numbers; unicode), textually (duplicate keys, anchors and aliases, merge keys, tags, stray syntax)
and at the byte level (flipped, inserted and truncated bytes, pure garbage), with random `--set`
strings. The property, for every case:

- `validate_job(..., static=True)` returns (never raises) and every problem has a file, a line and
  column >= 1 and a non-empty dotted path (`(file)` for problems about the whole file);
- through the CLI (a sample of cases, all three output formats) the exit code is 0, 1 or 2, and the
  output holds neither a traceback nor an "unexpected" error line.

Run: .venv/bin/python benchmarks/fuzz_jobs.py [--cases 10000] [--cli-every 10] [--seed 0]
Prints the counts (cases, by exit code, by input kind, failures) and exits 1 on any failure.
tests/core/job/test_fuzz_jobs.py runs a fixed-seed slice of the same generator in the default suite.
"""

from __future__ import annotations

import argparse
import collections
import copy
import glob
import json
import os
import sys
import tempfile
import time
import traceback
from typing import Any, List, Optional, Sequence

import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

BASE_FILES = sorted(glob.glob(os.path.join(ROOT, "tests", "jobs", "good", "*.yaml"))
                    + glob.glob(os.path.join(ROOT, "tpulaunch", "templates", "*.yaml")))
BASE_TEXTS = {os.path.basename(p): open(p, encoding="utf-8").read() for p in BASE_FILES}
BASES = {name: yaml.safe_load(text) for name, text in BASE_TEXTS.items()}
ENV = {"BUCKET": "fuzz-bucket", "TPU_NAME": "fuzz-tpu", "API_TOKEN": "tok-123456789"}
EXIT_CODES = {0, 1, 2}

# Values that are the wrong type, out of range, huge, non-finite, or just strange text.
ODD_VALUES = [
    None, True, False, 0, -1, 1, 7, 2**31, 2**63, -(2**63) - 1, 10**40, 10**400, 0.5, -0.0, 1e308, 1e-320,
    float("inf"), float("-inf"), float("nan"), "", " ", "0", "1e9", "yes", "null", "~", "v3-8", "v9-1024",
    "pkg.mod:fn", "os:system", "../../etc/passwd", "gs://", "gs://b/x-*.tfrecord", "${UNSET}", "${API_TOKEN}",
    "\u00e9t\u00e9", "\U0001f4a5", "\u202e", "\ufeff", "a\nb", "x" * 300, [], {}, [1, 2, 3], [[1]], [None],
    {"a": 1}, {"shape": [1]}, [0, 0], [-1], [1, 2, 2, 2, 1],
]
KEY_WORDS = ["name", "model", "data", "tpu", "partition", "train", "eval", "run", "builder", "params", "loss",
             "optimizer", "metrics", "features", "labels", "shape", "dtype", "encoding", "batch_size", "steps",
             "every_steps", "model_dir", "cores_per_replica", "type", "iterations_per_loop", "learning_rate",
             "skip_corrupt", "input_fn", "model_fn", "precision", "compression", "api_key", "password"]
# Fragments dropped into the text at random places: YAML syntax, tags, aliases, interpolation, odd unicode.
FRAGMENTS = [
    "\t", "{", "}", "[", "]", ": ", ":", "- ", "? ", "#", "'", '"', "&a ", "*a", "*undefined", "<<: *a\n",
    "!!python/object/apply:os.system ['touch PWNED']", "!!python/name:os.system", "!!binary aGk=", "!!set {a}",
    "!!timestamp 2001-12-14", "!!float", "!custom ", "%YAML 1.1\n---\n", "---\n", "...\n", "|\n  x\n", ">-\n",
    "${API_TOKEN}", "${UNSET_VAR}", "${X:-}", "${", "\ufeff", "\u202e", "\u00e9", "\U0001f4a5", "\r", "\r\n",
    "\x85", "\u2028", "@", "`", "%", "!", "&", "*", "|", ">", "\\", "\x07",
]
OVERRIDE_VALUES = ["1", "0", "-5", "1e999", "[1, 2]", "{a: 1}", "null", "", "'x'", "\"${API_TOKEN}\"", "v3-8",
                   "!!python/object/apply:os.system ['true']", "[", "{", "a: b: c", "&a x", "*a", "\t", "\u00e9"]


def _paths(node: Any, prefix: tuple = ()) -> List[tuple]:
    """Every path in the document (the root excluded): dict keys and list indices."""
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            out.append(prefix + (key,))
            out += _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.append(prefix + (i,))
            out += _paths(value, prefix + (i,))
    return out


def _parent(data: Any, path: tuple):
    node = data
    for part in path[:-1]:
        node = node[part]
    return node


def _dotted_paths(data: Any) -> List[str]:
    return [".".join(str(p) for p in path) for path in _paths(data)]


odd_values = st.one_of(st.sampled_from(ODD_VALUES), st.integers(), st.floats(), st.text(max_size=20),
                       st.lists(st.integers(min_value=-3, max_value=9), max_size=6))
odd_keys = st.one_of(st.sampled_from(KEY_WORDS), st.text(min_size=1, max_size=12), st.integers(-5, 5),
                     st.sampled_from(["", " ", "~", "null", "true", "1.5", "a.b", "a[0]", "\U0001f4a5"]))


@st.composite
def structural_mutation(draw, data: Any) -> Any:
    """One structural change to `data` (in place when possible); returns the new document."""
    paths = _paths(data)
    if not paths:
        return draw(odd_values)
    path = draw(st.sampled_from(paths))
    parent = _parent(data, path)
    key = path[-1]
    op = draw(st.sampled_from(["drop", "rename", "retype", "wrap_list", "wrap_dict", "move", "typo",
                               "number", "unicode", "add_key"]))
    if op == "drop":
        del parent[key]
    elif op == "rename" and isinstance(parent, dict):
        value = parent.pop(key)
        parent[draw(odd_keys)] = value
    elif op == "typo" and isinstance(parent, dict) and isinstance(key, str) and key:
        i = draw(st.integers(0, len(key) - 1))
        typo = draw(st.sampled_from([key[:i] + key[i + 1:], key[:i] + key[i] * 2 + key[i + 1:], key.upper(),
                                     key.replace("_", "-"), key + "s"]))
        parent[typo or "x"] = parent.pop(key)
    elif op == "retype":
        parent[key] = draw(odd_values)
    elif op == "wrap_list":
        parent[key] = [parent[key]]
    elif op == "wrap_dict":
        parent[key] = {draw(odd_keys): parent[key]}
    elif op == "move":
        target = draw(st.sampled_from(paths))
        holder = _parent(data, target)
        if isinstance(holder, dict) and target[:len(path)] != path:
            holder[draw(st.sampled_from([target[-1], draw(odd_keys)]))] = copy.deepcopy(parent[key])
    elif op == "number":
        parent[key] = draw(st.one_of(st.integers(min_value=-(10**30), max_value=10**30), st.floats(),
                                     st.sampled_from([0, -1, 10**400, 2**64, float("nan"), float("inf")])))
    elif op == "unicode":
        parent[key] = draw(st.text(min_size=1, max_size=30))
    elif op == "add_key" and isinstance(parent, dict):
        parent[draw(odd_keys)] = draw(odd_values)
    return data


def _dump(draw, data: Any) -> str:
    style = draw(st.sampled_from([False, None, True]))
    try:
        return yaml.safe_dump(data, default_flow_style=style, allow_unicode=draw(st.booleans()), sort_keys=False,
                              width=draw(st.sampled_from([80, 10**6])))
    except (yaml.YAMLError, ValueError, OverflowError):
        return repr(data)


@st.composite
def text_mutation(draw, text: str) -> str:
    """One textual change: a duplicated line, an anchor/alias pair, a fragment, a cut."""
    lines = text.split("\n")
    op = draw(st.sampled_from(["duplicate_line", "alias", "merge", "fragment", "fragment", "cut", "swap_lines"]))
    i = draw(st.integers(0, max(0, len(lines) - 1)))
    if op == "duplicate_line":
        lines.insert(i, lines[i])
    elif op == "alias":
        # `key: &x value` on one line, `*x` as the value of another
        j = draw(st.integers(0, max(0, len(lines) - 1)))
        if ": " in lines[i]:
            k, v = lines[i].split(": ", 1)
            lines[i] = f"{k}: &x {v}"
        if ": " in lines[j] and j != i:
            lines[j] = lines[j].split(": ", 1)[0] + ": *x"
    elif op == "merge":
        lines.insert(0, "base: &base {batch_size: 8, steps: 10}")
        lines.append(draw(st.sampled_from(["train: {<<: *base}", "train:\n  <<: *base\n  steps: 3",
                                           "train: {<<: [*base, *base]}", "train: {<<: *nope}"])))
    elif op == "fragment":
        line = lines[i]
        at = draw(st.integers(0, len(line)))
        lines[i] = line[:at] + draw(st.sampled_from(FRAGMENTS)) + line[at:]
    elif op == "cut":
        text = "\n".join(lines)
        return text[: draw(st.integers(0, len(text)))]
    elif op == "swap_lines":
        j = draw(st.integers(0, max(0, len(lines) - 1)))
        lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


@st.composite
def byte_mutation(draw, raw: bytes) -> bytes:
    op = draw(st.sampled_from(["flip", "insert", "truncate", "garbage"]))
    if op == "garbage":
        return draw(st.binary(max_size=300))
    if not raw:
        return raw
    at = draw(st.integers(0, len(raw) - 1))
    if op == "flip":
        return raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1:]
    if op == "insert":
        return raw[:at] + draw(st.binary(min_size=1, max_size=8)) + raw[at:]
    return raw[:at]


@st.composite
def overrides(draw, data: Any) -> List[str]:
    known = _dotted_paths(data) if isinstance(data, (dict, list)) else []
    one = st.one_of(
        st.text(max_size=30),
        st.builds(lambda k, v: f"{k}={v}", st.sampled_from(known or ["name"]),
                  st.one_of(st.sampled_from(OVERRIDE_VALUES), st.text(max_size=15))),
        st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["a..b", ".x", "x.", "=", "train.steps.x",
                                                            "model.params.api_key", "tpu.type", "9.9", "data.train.0"]),
                  st.sampled_from(OVERRIDE_VALUES)),
    )
    return draw(st.lists(one, max_size=3))


@st.composite
def job_cases(draw):
    """(kind, file bytes, --set overrides) for one generated case."""
    name = draw(st.sampled_from(sorted(BASES)))
    kind = draw(st.sampled_from(["structural", "structural", "structural", "text", "text", "bytes", "unchanged"]))
    data = copy.deepcopy(BASES[name])
    if kind == "unchanged":
        raw = BASE_TEXTS[name].encode()
    elif kind == "structural":
        for _ in range(draw(st.integers(1, 4))):
            data = draw(structural_mutation(data))
        raw = _dump(draw, data).encode("utf-8", "surrogatepass")
    elif kind == "text":
        text = BASE_TEXTS[name] if draw(st.booleans()) else _dump(draw, data)
        for _ in range(draw(st.integers(1, 3))):
            text = draw(text_mutation(text))
        raw = text.encode("utf-8", "surrogatepass")
    else:
        raw = BASE_TEXTS[name].encode()
        for _ in range(draw(st.integers(1, 3))):
            raw = draw(byte_mutation(raw))
    sets = draw(overrides(data)) if draw(st.integers(0, 3)) == 0 else []
    return kind, raw, sets


# ------------------------------------------------------------------------------------------ the property

def problem_failures(problems: Sequence) -> List[str]:
    """What is wrong with a list of problems: each needs a file, line/column >= 1 and a dotted path."""
    bad = []
    for p in problems:
        if not p.file or not isinstance(p.line, int) or p.line < 1 or not isinstance(p.column, int) or p.column < 1:
            bad.append(f"unlocated problem {p}")
        elif not p.path:
            bad.append(f"problem without a path {p}")
        elif p.severity not in ("error", "warning") or not p.code or not p.message:
            bad.append(f"incomplete problem {p}")
    return bad


def check_in_process(path: str, sets: Sequence[str]) -> tuple:
    """(exit code 0/1, failures, problems) of validate_job(static=True) on one case."""
    from tpulaunch.checks.validate import validate_job

    try:
        result = validate_job(path, list(sets), static=True, env=ENV)
    except Exception:  # noqa: BLE001 - the property is exactly that nothing escapes
        return None, ["validate_job raised:\n" + traceback.format_exc(limit=6)], []
    return (0 if result.ok else 1), problem_failures(result.problems), result.problems


def check_cli(path: str, sets: Sequence[str], fmt: str) -> tuple:
    """(exit code, failures) of `tpulaunch validate --static --format FMT` through click's CliRunner."""
    from click.testing import CliRunner

    from tpulaunch.cli.app import cli

    args = ["validate", "--static", "--format", fmt, path]
    for value in sets:
        args += ["--set", value]
    result = CliRunner().invoke(cli, args, env={**ENV, "NO_COLOR": "1", "COLUMNS": "200"})
    output = result.output  # stdout and stderr, interleaved
    failures = []
    if result.exit_code not in EXIT_CODES:
        failures.append(f"exit code {result.exit_code}")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        failures.append("exception escaped: " + "".join(traceback.format_exception(result.exception))[-1500:])
    if "Traceback" in output or "error: unexpected" in output:
        failures.append("traceback or unexpected error in output:\n" + output[-1500:])
    if fmt == "json" and result.exit_code in (0, 1):
        try:
            doc = json.loads(result.stdout)
            failures += [f"json: {f}" for f in _json_problem_failures(doc)]
        except ValueError:
            failures.append("--format json printed no JSON:\n" + result.stdout[-500:])
    return result.exit_code, failures


def _json_problem_failures(doc: dict) -> List[str]:
    from tpulaunch.errors import Problem

    return problem_failures([Problem(**p) for p in doc.get("problems", [])])


class Tally:
    """Counts of a fuzzing run."""

    def __init__(self):
        self.cases = 0
        self.cli_cases = 0
        self.exit_codes: collections.Counter = collections.Counter()
        self.cli_exit_codes: collections.Counter = collections.Counter()
        self.kinds: collections.Counter = collections.Counter()
        self.problem_codes: collections.Counter = collections.Counter()
        self.failures: list = []

    def record(self, kind: str, raw: bytes, sets, workdir: str, *, cli_format: Optional[str]) -> List[str]:
        path = os.path.join(workdir, "job.yaml")
        with open(path, "wb") as handle:
            handle.write(raw)
        self.cases += 1
        self.kinds[kind] += 1
        code, failures, problems = check_in_process(path, sets)
        self.exit_codes[code] += 1
        self.problem_codes.update(p.code for p in problems)
        if cli_format:
            self.cli_cases += 1
            cli_code, cli_failures = check_cli(path, sets, cli_format)
            self.cli_exit_codes[cli_code] += 1
            failures = failures + [f"cli --format {cli_format}: {f}" for f in cli_failures]
        if failures:
            self.failures.append({"kind": kind, "raw": raw[:400], "sets": list(sets), "failures": failures})
        return failures


def run(cases: int, *, cli_every: int, seed: Optional[int], derandomize: bool = False) -> Tally:
    """Generate `cases` cases with hypothesis and check each; returns the tally (never raises)."""
    tally = Tally()
    formats = ("text", "json", "github")
    workdir = tempfile.mkdtemp(prefix="tpulaunch-fuzz-")

    @settings(max_examples=cases, deadline=None, database=None, derandomize=derandomize,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(job_cases())
    def one(case):
        kind, raw, sets = case
        fmt = formats[(tally.cases // cli_every) % 3] if cli_every and tally.cases % cli_every == 0 else None
        tally.record(kind, raw, sets, workdir, cli_format=fmt)

    if seed is not None and not derandomize:
        from hypothesis import seed as hypothesis_seed

        one = hypothesis_seed(seed)(one)
    one()
    return tally


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--cli-every", type=int, default=10, help="also run every N-th case through the CLI")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    started = time.monotonic()
    tally = run(args.cases, cli_every=args.cli_every, seed=args.seed)
    seconds = time.monotonic() - started
    print(f"cases generated:        {tally.cases}  ({seconds:.0f} s, seed {args.seed}, bases: {', '.join(sorted(BASES))})")
    print(f"by input kind:          {dict(sorted(tally.kinds.items()))}")
    print(f"validate_job exit:      {dict(sorted(tally.exit_codes.items(), key=str))}")
    print(f"CLI cases:              {tally.cli_cases}  exit: {dict(sorted(tally.cli_exit_codes.items(), key=str))}")
    print(f"most common problems:   {dict(tally.problem_codes.most_common(12))}")
    print(f"distinct problem codes: {len(tally.problem_codes)}")
    print(f"failures (tracebacks, bad exits, unlocated problems): {len(tally.failures)}")
    for failure in tally.failures[:5]:
        print("---", failure["kind"], repr(failure["raw"][:200]), failure["sets"])
        for line in failure["failures"]:
            print("   ", line[:1500])
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
