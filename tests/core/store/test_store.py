"""The store, local and on gs:// (google-cloud-storage against fake-gcs-server, which enforces generation
preconditions, through gcs_fake's proxy, which can stop answering or lose a reply): each call's behaviour once per
backend, and what only one backend has (the local guard file; an outage and a lost reply on gs://)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time

import pytest

from lease_runs import outage_storage, storage_client_env
from tpulaunch import store


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    """The proxy to fake-gcs-server (bucket `runs`), reached by this process's store for the module."""
    with outage_storage(tmp_path_factory) as (runs, _):
        saved = {name: os.environ.get(name) for name in storage_client_env(runs)}
        os.environ.update(storage_client_env(runs))
        try:
            yield runs
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@pytest.fixture(params=["local", "gs"])
def root(request, tmp_path) -> str:
    """A folder of each backend, empty: a local one, or one of its own in the bucket."""
    if request.param == "local":
        return str(tmp_path)
    request.getfixturevalue("cloud")
    return f"gs://runs/{request.node.name.replace('[', '-').rstrip(']')}"


def test_what_is_written_is_read_back_whole_with_its_generation(root):
    url = f"{root}/a/file.json"
    assert store.read(url) is None and store.generation(url) == 0 and not store.exists(url)
    written = store.write(url, b'{"step": 1}\n')
    found = store.read(url)
    assert found == store.Found(b'{"step": 1}\n', written) and written != 0
    assert store.generation(url) == written and store.exists(url)
    assert store.read(url, start=2).data == b'step": 1}\n'
    assert store.read(url, start=12).data == b""  # nothing past the end yet


def test_a_write_with_a_generation_precondition_lands_only_at_that_generation(root):
    url = f"{root}/lease"
    first = store.write(url, b"first", if_generation_match=0)  # only if there is none
    with pytest.raises(store.PreconditionFailed):
        store.write(url, b"second", if_generation_match=0)
    second = store.write(url, b"second", if_generation_match=first)
    with pytest.raises(store.PreconditionFailed):
        store.write(url, b"third", if_generation_match=first)  # what it was decided on has changed
    assert store.read(url) == store.Found(b"second", second) and second != first
    with pytest.raises(store.PreconditionFailed):
        store.write(f"{root}/never-written", b"x", if_generation_match=second)


def test_rename_moves_the_file(root):
    source, target = f"{root}/staging/model.index", f"{root}/model.index"
    store.write(source, b"index")
    store.write(target, b"older")
    store.rename(source, target)
    assert store.read(source) is None and store.read(target).data == b"index"
    with pytest.raises(store.NotFound):
        store.rename(source, target)


def test_copy_leaves_the_source(root):
    store.write(f"{root}/one", b"bytes")
    store.copy(f"{root}/one", f"{root}/two")
    assert store.read(f"{root}/one").data == store.read(f"{root}/two").data == b"bytes"
    with pytest.raises(store.NotFound):
        store.copy(f"{root}/none", f"{root}/three")


def test_delete_removes_the_file_and_says_when_there_is_none(root):
    url = f"{root}/old.log"
    store.write(url, b"old")
    store.delete(url)
    assert not store.exists(url)
    with pytest.raises(store.NotFound):
        store.delete(url)
    store.delete(url, missing_ok=True)


def test_list_files_matches_a_glob_within_one_folder_or_everything_under_a_folder(root):
    for name in ("attempts/1/worker-0.log", "attempts/1/worker-1.log", "attempts/1/vm.json", "attempts/2/worker-0.log"):
        store.write(f"{root}/{name}", b"x")
    assert store.list_files(f"{root}/attempts/1/worker-*.log") == [f"{root}/attempts/1/worker-0.log",
                                                                   f"{root}/attempts/1/worker-1.log"]
    assert store.list_files(f"{root}/attempts/*/vm.json") == [f"{root}/attempts/1/vm.json"]
    assert store.list_files(f"{root}/attempts/2/") == [f"{root}/attempts/2/worker-0.log"]
    assert store.list_files(f"{root}/attempts/3/") == []


def test_a_path_of_another_store_is_refused_by_name():
    with pytest.raises(store.StoreError) as refused:
        store.read("s3://bucket/run/tpulaunch.lease")
    assert refused.value.message.startswith("s3://bucket/run/tpulaunch.lease is neither a local path nor a gs:// URL")


# ------------------------------------------------------------------------------------------- local only

def test_local_conditional_writes_raced_by_threads_exactly_one_wins(tmp_path):
    url = str(tmp_path / "lease")
    start = store.write(url, b"start")
    barrier, won = threading.Barrier(8), []

    def contend(index):
        barrier.wait()
        try:
            store.write(url, f"writer {index}".encode(), if_generation_match=start)
            won.append(index)
        except store.PreconditionFailed:
            pass

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and store.read(url).data == f"writer {won[0]}".encode()
    assert sorted(os.listdir(tmp_path)) == ["lease"]  # no temporary or guard file left


def test_local_rename_and_delete_honour_their_preconditions(tmp_path):
    """(On gs:// the server checks them: `test_gs_copies_and_deletes_carry_their_preconditions`.)"""
    source, target = str(tmp_path / "staging" / "model.index"), str(tmp_path / "model.index")
    store.write(source, b"index")
    older = store.write(target, b"older")
    with pytest.raises(store.PreconditionFailed):
        store.rename(source, target, if_generation_match=0)
    assert store.read(source).data == b"index" and store.read(target).data == b"older"  # both as they were
    store.rename(source, target, if_generation_match=older)
    assert store.read(target).data == b"index"
    with pytest.raises(store.PreconditionFailed):
        store.delete(target, if_generation_match=older)
    store.delete(target, if_generation_match=store.generation(target))
    assert not store.exists(target)


def test_local_guard_of_a_killed_writer_is_removed_not_waited_for(tmp_path):
    url = str(tmp_path / "lease")
    store.write(url, b"before")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    (tmp_path / "lease.lock").write_text(f"{socket.gethostname()} {int(dead.stdout)} 0badc0de")
    began = time.monotonic()
    store.write(url, b"after", if_generation_match=store.generation(url))
    assert time.monotonic() - began < 1 and store.read(url).data == b"after"
    assert not (tmp_path / "lease.lock").exists()


def test_local_private_files_are_this_users_alone(tmp_path):
    store.write(str(tmp_path / "stage.json"), b"{}", private=True)
    assert stat.S_IMODE(os.stat(tmp_path / "stage.json").st_mode) == 0o600


# ------------------------------------------------------------------------------------------- gs:// only

def test_a_bucket_that_does_not_answer_is_unreachable_within_the_timeout(cloud):
    url = "gs://runs/outage/tpulaunch.lease"
    store.write(url, b"held")
    began = time.monotonic()
    with cloud.outage():
        with pytest.raises(store.Unreachable) as failed:
            store.read(url)
    assert time.monotonic() - began < store.TIMEOUT_S + 2
    assert failed.value.message.startswith(f"could not reach Cloud Storage bucket gs://runs to read {url} within "
                                           f"{store.TIMEOUT_S:g} s"), failed.value.message
    assert store.read(url).data == b"held"  # answering again, nothing lost


def test_a_conditional_write_whose_reply_was_lost_fails_its_precondition_on_the_retry(cloud):
    """The server applied it, the client's retry is refused: `PreconditionFailed`, and the object holds this write,
    which the caller tells from another's by reading it back (as the lease does)."""
    url = "gs://runs/lost-reply/tpulaunch.lease"
    first = store.write(url, b"first")
    cloud.lose_reply(["/upload/storage/v1/b/runs/o?uploadType=multipart", f"ifGenerationMatch={first}"],
                     body="lost-reply/tpulaunch.lease")
    with pytest.raises(store.PreconditionFailed):
        store.write(url, b"mine", if_generation_match=first)
    assert store.read(url).data == b"mine"


def test_gs_copies_and_deletes_carry_their_preconditions(cloud):
    """Cloud Storage checks a copy's and a delete's generation preconditions on the server; fake-gcs-server enforces
    them only on uploads, so here each request is checked to ask for them."""
    source, target = "gs://runs/preconditions/staging/model.index", "gs://runs/preconditions/model.index"
    copied = store.write(source, b"index")
    older = store.write(target, b"older")
    store.rename(source, target, if_generation_match=older)
    assert store.read(source) is None and store.read(target).data == b"index"
    requests = [entry["request"] for entry in cloud.log_entries() if "request" in entry]
    copy = [line for line in requests if "/copyTo/" in line or "/rewriteTo/" in line][-1]
    assert f"ifGenerationMatch={older}" in copy and f"ifSourceGenerationMatch={copied}" in copy, copy
    delete = [line for line in requests if line.startswith("DELETE ") and "preconditions%2Fstaging" in line][-1]
    assert f"ifGenerationMatch={copied}" in delete, delete


def test_a_listing_shows_none_of_the_stores_own_files(tmp_path):
    """A guard left by a holder that died, and a temporary file a crash left, are the store's, not the caller's."""
    folder = tmp_path / "attempts"
    store.write(str(folder / "worker-0.json"), b"{}")
    (folder / "worker-0.json.lock").write_bytes(b"host 1 abcd")
    (folder / "worker-1.json.store.123.abcdef.tmp").write_bytes(b"{")
    assert store.list_files(str(folder) + "/") == [str(folder / "worker-0.json")]
    assert store.list_files(str(folder / "*")) == [str(folder / "worker-0.json")]
