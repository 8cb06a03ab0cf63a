"""A small slice of the fault campaign (benchmarks/faults.py, docs/reliability.md): one random fault of three kinds,
on the estimator engine, each compared with an uninterrupted run, so the campaign itself stays runnable and right.

The other kinds have tests of their own, each waiting for the event it needs: SIGKILL and SIGINT/SIGTERM
(tests/estimator/run/test_faults.py, test_signals.py), a frozen run (tests/estimator/run/test_fencing.py), a full disk during a
save (tests/estimator/run/test_faults.py).
"""

import sys

from paths import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

import faults  # noqa: E402

KINDS = ("sighup", "corrupt-shard", "nan")


def test_one_random_fault_of_each_kind_loses_nothing_but_uncheckpointed_steps(tmp_path):
    said = []
    injected = faults.run_campaign(str(tmp_path), engine="estimator", kinds=KINDS, per_kind=1, seed=7, steps=20,
                                   every=5, report=said.append)
    assert [fault.kind for fault in injected] == list(KINDS)
    for fault in injected:
        assert fault.ok, "\n".join(said)
        assert fault.records_lost == 0 and fault.mixed_files == 0, faults._line(fault)
    ran = [fault for fault in injected if not fault.skipped]
    assert [fault.kind for fault in ran] == list(KINDS), [faults._line(fault) for fault in injected]
    table = faults.table(injected)
    assert table.splitlines()[-1].startswith(f"| all | {len(ran)} |"), table
