"""tpulaunch's offline partition/batch rules and TensorFlow's own TPUEstimator reach the same verdicts.

Each row of `CASES` is a job file. The offline side is `validate --static` (tpulaunch.plan.partition via
tpulaunch.checks.static); the TensorFlow side builds the job's train (and eval) graph with TF 2.15's own
TPUEstimator on a faked slice (tpulaunch.engine.estimator.offline), with the job's real RunConfig from
tpulaunch.engine.estimator.runner. All TF builds run in one child process.

Agreement: accepted offline <=> accepted by TF, and when both reject, the key TF's error is about
is one of the keys the offline rules flag. `EXCEPTIONS` lists the rows where the two differ on
purpose or by a known gap, with the reason; they must keep differing exactly as documented.
Last run: 66 cases (31 accepted, 35 rejected by TF), 64 agree, 2 documented exceptions, 0 disagreements.
"""

from __future__ import annotations

import yaml

from tpulaunch.job.load import load_job
from tpulaunch.engine.estimator.offline import run_cases_in_subprocess
from tpulaunch.engine.estimator.verdict import blamed_key, cases_for_job, modes_of
from tpulaunch.checks.validate import validate_job
from tpulaunch.plan.build import build_plan

IMG = [16, 16, 3]
VOL = [8, 8, 8, 1]

# name: (tpu type, cores_per_replica, features {name: (shape, dims)}, labels {name: (shape, dims)}, train batch, eval batch)
# dims: a list, None (replicated), or "-" (not in partition:).
CASES = {
    # ---------------------------------------------------------------- accepted
    "rank4-split-h": ("v3-8", 2, {"image": (IMG, [1, 2, 1, 1])}, {"label": ([], "-")}, 8, None),
    "rank4-split-hw": ("v3-8", 4, {"image": (IMG, [1, 2, 2, 1])}, {"label": ([], "-")}, 8, 8),
    "rank4-8-cores": ("v3-8", 8, {"image": (IMG, [1, 2, 4, 1])}, {"label": ([], "-")}, 2, None),
    "rank5-8-cores": ("v3-8", 8, {"image": (VOL, [1, 2, 2, 2, 1])}, {"mask": ([8, 8, 8], [1, 2, 2, 2])}, 1, 1),
    "rank5-v3-32-16": ("v3-32", 16, {"image": (VOL, [1, 4, 2, 2, 1])}, {"mask": ([8, 8, 8], [1, 4, 2, 2])}, 2, 2),
    "rank5-v3-32-32": ("v3-32", 32, {"image": (VOL, [1, 4, 4, 2, 1])}, {"mask": ([8, 8, 8], "-")}, 1, None),
    "rank3-split": ("v3-8", 4, {"x": ([8, 8], [1, 2, 2])}, {"y": ([], "-")}, 8, None),
    "rank2-split": ("v3-8", 2, {"x": ([10], [1, 2])}, {"y": ([], "-")}, 8, None),
    "rank2-uneven": ("v3-8", 2, {"x": ([9], [1, 2])}, {"y": ([], "-")}, 8, None),
    "rank4-uneven": ("v3-32", 4, {"image": ([15, 16, 3], [1, 2, 2, 1])}, {"label": ([], "-")}, 8, 8),
    "rank4-zero-piece": ("v3-8", 4, {"image": ([6, 8, 3], [1, 4, 1, 1])}, {"label": ([], "-")}, 8, None),
    "rank4-smaller-than-dims": ("v3-8", 4, {"image": ([3, 8, 3], [1, 4, 1, 1])}, {"label": ([], "-")}, 8, None),
    "batch-split": ("v3-8", 2, {"image": (IMG, [2, 1, 1, 1])}, {"label": ([], "-")}, 8, None),
    "batch-split-zero": ("v3-8", 4, {"image": (IMG, [4, 1, 1, 1])}, {"label": ([], "-")}, 4, None),
    "label-core0": ("v3-8", 4, {"image": (IMG, [1, 2, 2, 1])}, {"mask": ([16, 16], [1])}, 8, None),
    "label-core0-scalar": ("v3-8", 4, {"image": (IMG, [1, 2, 2, 1])}, {"label": ([], [1])}, 8, None),
    "label-replicated": ("v3-8", 4, {"image": (IMG, [1, 2, 2, 1])}, {"mask": ([16, 16], None)}, 8, None),
    "label-all-ones": ("v3-8", 4, {"image": (IMG, [1, 2, 2, 1])}, {"mask": ([16, 16], [1, 1, 1])}, 8, None),
    "label-split": ("v3-8", 4, {"image": (IMG, [1, 2, 2, 1])}, {"mask": ([16, 16], [1, 2, 2])}, 8, 8),
    "feature-all-ones": ("v3-8", 4, {"image": (IMG, [1, 1, 1, 1])}, {"label": ([], "-")}, 8, None),
    "cpr1-all-ones": ("v3-8", 1, {"image": (IMG, [1, 1, 1, 1])}, {"label": ([], "-")}, 8, None),
    "cpr1-no-partition": ("v3-8", 1, {"image": (IMG, "-")}, {"label": ([], "-")}, 16, 8),
    "v3-32-cpr8": ("v3-32", 8, {"image": (IMG, [1, 2, 4, 1])}, {"label": ([], "-")}, 8, None),
    "v3-32-cpr2": ("v3-32", 2, {"image": (IMG, [1, 1, 2, 1])}, {"label": ([], "-")}, 32, 16),
    "dict-one-replicated": ("v3-8", 4, {"image": (IMG, [1, 2, 2, 1]), "extra": ([5], None)}, {"label": ([], "-")}, 8, None),
    "dict-both-split": ("v3-8", 2, {"image": (IMG, [1, 2, 1, 1]), "aux": ([8, 8], [1, 1, 2])}, {"label": ([], "-")}, 8, None),
    "dict-labels": ("v3-8", 4, {"image": (IMG, [1, 2, 2, 1])}, {"mask": ([16, 16], [1, 2, 2]), "kind": ([], None)}, 8, None),
    "no-labels": ("v3-8", 4, {"image": (IMG, [1, 2, 2, 1])}, {}, 8, None),
    "four-small-features": ("v3-8", 2, {"image": (IMG, [1, 2, 1, 1]), **{f"s{i}": ([1], None) for i in range(4)}}, {"label": ([], "-")}, 8, None),
    "int-feature-split": ("v3-8", 2, {"tokens": ([16, 4], [1, 2, 1])}, {"label": ([], "-")}, 8, None),
    # ---------------------------------------------------------------- rejected
    "product-low": ("v3-8", 4, {"image": (IMG, [1, 2, 1, 1])}, {"label": ([], "-")}, 8, None),
    "product-high": ("v3-8", 4, {"image": (IMG, [1, 4, 4, 1])}, {"label": ([], "-")}, 8, None),
    "product-rank5": ("v3-8", 8, {"image": (VOL, [1, 2, 2, 1, 1])}, {"mask": ([8, 8, 8], [1, 2, 2, 2])}, 1, None),
    "label-product": ("v3-8", 4, {"image": (IMG, [1, 2, 2, 1])}, {"mask": ([16, 16], [1, 2, 1])}, 8, None),
    "rank-short": ("v3-8", 4, {"image": (IMG, [1, 2, 2])}, {"label": ([], "-")}, 8, None),
    "rank-long": ("v3-8", 4, {"x": ([8, 8], [1, 2, 2, 1])}, {"y": ([], "-")}, 8, None),
    "rank5-short": ("v3-8", 8, {"image": (VOL, [1, 2, 2, 2])}, {"mask": ([8, 8, 8], "-")}, 1, None),
    "rank2-long": ("v3-8", 2, {"x": ([10], [1, 2, 1])}, {"y": ([], "-")}, 8, None),
    "label-rank": ("v3-8", 4, {"image": (IMG, [1, 2, 2, 1])}, {"mask": ([16, 16], [1, 2, 2, 1])}, 8, None),
    "dim-zero": ("v3-8", 4, {"image": (IMG, [1, 0, 2, 1])}, {"label": ([], "-")}, 8, None),
    "dim-negative": ("v3-8", 4, {"image": (IMG, [1, -2, -2, 1])}, {"label": ([], "-")}, 8, None),
    "ones-wrong-length": ("v3-8", 4, {"image": (IMG, [1, 1])}, {"label": ([], "-")}, 8, None),
    "label-ones-wrong-length": ("v3-8", 4, {"image": (IMG, [1, 2, 2, 1])}, {"mask": ([16, 16], [1, 1])}, 8, None),
    # TF checks dict entries in sorted-key order: aux, then image.
    "dict-first-wrong": ("v3-8", 4, {"image": (IMG, [1, 2, 2, 1]), "aux": ([8, 8], [1, 2, 1])}, {"label": ([], "-")}, 8, None),
    "dict-second-wrong": ("v3-8", 4, {"aux": ([8, 8], [1, 2, 2]), "image": (IMG, [1, 2, 1, 1])}, {"label": ([], "-")}, 8, None),
    "batch-v3-8": ("v3-8", 2, {"image": (IMG, [1, 2, 1, 1])}, {"label": ([], "-")}, 6, None),
    "batch-v3-8-cpr1": ("v3-8", 1, {"image": (IMG, "-")}, {"label": ([], "-")}, 12, None),
    "batch-v3-32": ("v3-32", 16, {"image": (VOL, [1, 4, 2, 2, 1])}, {"mask": ([8, 8, 8], [1, 4, 2, 2])}, 3, None),
    "batch-v3-32-cpr4": ("v3-32", 4, {"image": (IMG, [1, 2, 2, 1])}, {"label": ([], "-")}, 12, None),
    "eval-batch": ("v3-8", 2, {"image": (IMG, [1, 2, 1, 1])}, {"label": ([], "-")}, 8, 6),
    "eval-batch-v3-32": ("v3-32", 8, {"image": (IMG, [1, 2, 4, 1])}, {"label": ([], "-")}, 8, 3),
    "cpr-too-large-v3-8": ("v3-8", 16, {"image": (VOL, [1, 4, 2, 2, 1])}, {"label": ([], "-")}, 8, None),
    "cpr-too-large-v3-32": ("v3-32", 64, {"image": (VOL, [1, 4, 4, 4, 1])}, {"label": ([], "-")}, 8, None),
    "cpr-three": ("v3-8", 3, {"image": (IMG, [1, 3, 1, 1])}, {"label": ([], "-")}, 8, None),
    "cpr-six": ("v3-32", 6, {"image": (IMG, [1, 3, 2, 1])}, {"label": ([], "-")}, 8, None),
    "cpr-twelve": ("v3-32", 12, {"image": (IMG, [1, 3, 4, 1])}, {"label": ([], "-")}, 8, None),
    "label-dim-zero": ("v3-8", 2, {"image": (IMG, [1, 2, 1, 1])}, {"mask": ([16, 16], [1, 0, 2])}, 8, None),
    "rank3-product": ("v3-32", 8, {"x": ([8, 8], [1, 2, 2])}, {"y": ([], "-")}, 8, None),
    "int-feature-rank": ("v3-8", 2, {"tokens": ([16, 4], [1, 2])}, {"label": ([], "-")}, 8, None),
    "unknown-dim-split": ("v3-8", 4, {"image": ([None, 16, 3], [1, 2, 2, 1])}, {"label": ([], "-")}, 8, None),
    "unknown-dim-replicated": ("v3-8", 4, {"image": (IMG, [1, 2, 2, 1]), "extra": ([None], None)}, {"label": ([], "-")}, 8, None),
    "unknown-dim-label": ("v3-8", 2, {"image": (IMG, [1, 2, 1, 1])}, {"mask": ([16, None], [1])}, 8, None),
    "unknown-dim-no-partition": ("v3-8", 1, {"image": ([16, None, 3], "-")}, {"label": ([], "-")}, 8, None),
    "unknown-dim-one-replica": ("v3-8", 8, {"image": ([16, None, 3], "-"), "aux": ([8, 8], [1, 2, 4])}, {"label": ([], "-")}, 1, None),
    # TensorPacker: 5+ [B,1] features of one dtype are packed, and the partitioned infeed then fails
    "five-small-features": ("v3-8", 2, {"image": (IMG, [1, 2, 1, 1]), **{f"s{i}": ([1], None) for i in range(5)}}, {"label": ([], "-")}, 8, None),
    # ---------------------------------------------------------------- documented exceptions
    "cpr1-split": ("v3-8", 1, {"image": (IMG, [1, 2, 1, 1])}, {"label": ([], "-")}, 8, None),
}

# name -> (offline accepts, TF accepts, why)
EXCEPTIONS = {
    "cpr1-split": (False, True,
                   "on purpose: with cores_per_replica 1 the job's RunConfig sets no input_partition_dims, so TF never "
                   "sees the dims; tpulaunch rejects dims that would be silently ignored"),
}


def _job_document(name, case) -> dict:
    tpu_type, cores, features, labels, train_batch, eval_batch = case
    partition = {group: {n: dims for n, (_, dims) in tensors.items() if dims != "-"}
                 for group, tensors in (("features", features), ("labels", labels))}
    data = {"train": "gs://bucket/train-*.tfrecord",
            "features": {n: {"shape": shape, "dtype": "int32" if n == "tokens" else "float32"}
                         for n, (shape, _) in features.items()},
            "labels": {n: {"shape": shape, "dtype": "int64"} for n, (shape, _) in labels.items()}}
    document = {
        "name": name,
        "model": {"builder": "tpulaunch.models.cnn:build"},
        "data": data,
        "tpu": {"name": "my-tpu", "type": tpu_type, "cores_per_replica": cores, "iterations_per_loop": 10},
        "train": {"batch_size": train_batch, "steps": 100},
        "run": {"model_dir": "gs://bucket/run", "save_checkpoints_steps": 100},
    }
    if any(partition.values()):
        document["partition"] = {group: dims for group, dims in partition.items() if dims}
    if eval_batch is not None:
        data["eval"] = "gs://bucket/eval-*.tfrecord"
        document["eval"] = {"batch_size": eval_batch, "steps": 2}
    return document


def _offline(path) -> tuple:
    """(accepted, dotted paths of every error) from `validate --static`."""
    result = validate_job(str(path), static=True)
    errors = [p for p in result.problems if p.is_error]
    return not errors, [p.path for p in errors]


def _blames(tf_key: tuple, offline_paths: list) -> bool:
    dotted = ".".join(map(str, tf_key))
    # Offline paths may go down to one entry: partition.features.image[1].
    return any(path == dotted or path.startswith((dotted + ".", dotted + "[")) for path in offline_paths)


def test_cases_cover_the_grid():
    ranks = {len(shape) + 1 for case in CASES.values() for shape, _ in case[2].values()}
    cores = {case[1] for case in CASES.values()}
    assert ranks == {2, 3, 4, 5}
    assert {1, 2, 4, 8, 16, 32} <= cores
    assert {case[0] for case in CASES.values()} == {"v3-8", "v3-32"}
    assert len(CASES) >= 60


def test_offline_rules_agree_with_tensorflow(tmp_path, capsys):
    jobs, offline = {}, {}
    for name, case in CASES.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(_job_document(name, case), sort_keys=False))
        loaded = load_job(str(path))
        assert loaded.job is not None, (name, loaded.problems)
        jobs[name] = loaded.job
        offline[name] = _offline(path)

    cases, owners = [], []
    for name, job in jobs.items():
        for case in cases_for_job(job, build_plan(job), job_model=False):
            cases.append(case)
            owners.append(name)
    verdicts = run_cases_in_subprocess(cases)
    per_job: dict = {}
    for name, verdict in zip(owners, verdicts):
        per_job.setdefault(name, []).append(verdict)

    table, disagreements = [], []
    for name, job in jobs.items():
        modes = modes_of(job)
        rejected = [(mode, v) for mode, v in zip(modes, per_job[name]) if not v.accepted]
        tf_accepts = not rejected
        offline_accepts, offline_paths = offline[name]
        tf_key = blamed_key(job, *rejected[0]) if rejected else None
        row = (name, offline_accepts, tf_accepts, tf_key, offline_paths,
               rejected[0][1].message if rejected else None)
        table.append(row)
        if name in EXCEPTIONS:
            expected = EXCEPTIONS[name][:2]
            if (offline_accepts, tf_accepts) != expected:
                disagreements.append(("exception no longer holds", *row))
            continue
        if offline_accepts != tf_accepts:
            disagreements.append(("verdict", *row))
        elif not tf_accepts and not _blames(tf_key, offline_paths):
            disagreements.append(("blamed key", *row))

    agree = len(CASES) - len(EXCEPTIONS) - len(disagreements)
    with capsys.disabled():
        print(f"\nTF agreement: {len(CASES)} cases, {agree} agree, {len(EXCEPTIONS)} documented exceptions, "
              f"{len(disagreements)} disagreements; TF accepted {sum(r[2] for r in table)}, "
              f"rejected {sum(not r[2] for r in table)}")
    assert disagreements == [], "\n".join(map(repr, disagreements))
    # Both sides must say something: a grid that only accepts (or only rejects) proves nothing.
    assert 20 <= sum(r[2] for r in table) <= len(CASES) - 20


def test_tensorflow_names_the_tensor_and_message(tmp_path):
    """TF's exact message and the tensor it was checking, for a wrong second dict entry."""
    name = "dict-second-wrong"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_job_document(name, CASES[name]), sort_keys=False))
    job = load_job(str(path)).job
    (verdict,) = run_cases_in_subprocess(cases_for_job(job, build_plan(job), job_model=False))
    assert (verdict.accepted, verdict.error_type, verdict.message, verdict.blamed) == (
        False, "ValueError",
        "The product of each input partition dim should equal to num_cores_per_replica. "
        "(dim = [1 2 1 1], num_cores_per_replica = 4)",
        "image")
    assert blamed_key(job, "train", verdict) == ("partition", "features", "image")
