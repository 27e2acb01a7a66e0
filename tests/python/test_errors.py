"""Errors: the daemon's refusals and failures surface as SpdlError with its message and a code;
the Python layer's own argument checks raise the usual Python exceptions."""

from __future__ import annotations

import pickle
import re
import shutil
import signal
import subprocess
import time

import pytest

import spdl_client
from conftest import SPDLD, _connectable, job_yaml


def test_bad_config_lists_every_problem_with_its_line(make_loader, dataset):
    text = (
        f"source: {{root: {dataset.root}}}\n"  # 1
        "batch: {size: 0}\n"                    # 2
        "transforms:\n"                          # 3
        "  - resize: {shorter: -3}\n"            # 4
        "  - center_crop: {size: 56}\n"          # 5
        "prefetch: 1000\n"                       # 6
        "bogus: 1\n"                             # 7
    )
    with pytest.raises(spdl_client.SpdlError) as err:
        make_loader(text)
    e = err.value
    assert isinstance(e, RuntimeError) and e.code == "INVALID_ARGUMENT"
    lines = str(e).splitlines()
    assert len(lines) == 5, str(e)  # a summary, then one line per problem
    assert [int(re.match(r"<config>:(\d+):\d+: ", l).group(1)) for l in lines[1:]] == [2, 4, 6, 7]
    assert "batch.size" in lines[1] and "prefetch" in lines[3] and "bogus" in lines[4]


def test_config_file_errors_name_the_file(make_loader, tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("source: {root: /x\n")
    with pytest.raises(spdl_client.SpdlError, match=re.escape(f"{path}:")) as err:
        make_loader(path)
    assert err.value.code == "INVALID_ARGUMENT"


def test_bad_override_values_are_reported(make_loader):
    with pytest.raises(spdl_client.SpdlError) as err:
        make_loader(overrides={"batch.size": "abc", "prefetch": 0})
    assert err.value.code == "INVALID_ARGUMENT"
    assert "batch.size" in str(err.value) and "prefetch" in str(err.value)


def test_no_daemon_at_the_socket(dataset, tmp_path):
    sock = str(tmp_path / "nobody.sock")
    t0 = time.monotonic()
    with pytest.raises(spdl_client.SpdlError) as err:
        spdl_client.Loader(job_yaml(dataset.root), socket=sock)
    assert time.monotonic() - t0 < 5
    assert err.value.code == "UNAVAILABLE"
    assert f"cannot connect to spdld at {sock}" in str(err.value) and "is the daemon running?" in str(err.value)


def test_root_outside_the_allowed_roots(make_loader, daemon, tmp_path_factory):
    with pytest.raises(spdl_client.SpdlError) as err:
        make_loader(job_yaml("/usr/share"))
    assert err.value.code == "PERMISSION_DENIED"
    assert "/usr/share" in str(err.value) and "not below any allowed root" in str(err.value)
    with pytest.raises(spdl_client.SpdlError) as err:
        make_loader(job_yaml(daemon.tmp / "no-such-dir"))
    assert err.value.code == "NOT_FOUND" and "no-such-dir" in str(err.value)


def _bad_dataset(daemon, dataset, name):
    """A copy of one class of the dataset plus one file that is not a JPEG."""
    root = daemon.tmp / name
    shutil.copytree(dataset.root / "class_000", root / "class_000")
    (root / "class_000" / "zz_broken.jpg").write_bytes(b"\xff\xd8 this is not a jpeg")
    return root


def test_a_failed_job_raises_with_the_daemon_message(make_loader, daemon, dataset):
    root = _bad_dataset(daemon, dataset, "bad-fail")
    loader = make_loader(job_yaml(root, batch=13, extra="on_error: fail\n"))  # one batch: all 13 files
    it = iter(loader)
    with pytest.raises(spdl_client.SpdlError) as err:
        list(it)
    assert err.value.code == "DATA_LOSS" and "zz_broken.jpg" in str(err.value)
    with pytest.raises(spdl_client.SpdlError) as again:  # errors are sticky
        next(it)
    assert str(again.value) == str(err.value)


def test_skipped_samples_are_counted(make_loader, daemon, dataset):
    root = _bad_dataset(daemon, dataset, "bad-skip")
    loader = make_loader(job_yaml(root, batch=4, extra="on_error: skip\n"))
    paths = [p for b in loader for p in b.paths]
    assert "class_000/zz_broken.jpg" not in paths and len(paths) == 12
    assert loader.stats()["skipped"] == 1 and loader.epoch_summaries[0]["skipped"] == 1


def test_a_job_whose_every_sample_fails_raises_instead_of_ending_empty(make_loader, daemon):
    root = daemon.tmp / "all-bad"
    (root / "class_000").mkdir(parents=True)
    for i in range(6):
        (root / "class_000" / f"bad_{i}.jpg").write_bytes(b"\xff\xd8 not a jpeg either")
    loader = make_loader(job_yaml(root, batch=2, extra="on_error: skip\n"))
    with pytest.raises(spdl_client.SpdlError) as err:
        batches = list(loader)
        assert not batches  # never reached: no batch at all, then the error
    # No batch of 0 rows, no empty success.
    assert err.value.code == "DATA_LOSS" and "without delivering a single sample" in str(err.value)


def test_a_daemon_that_dies_gives_an_error_not_a_hang(dataset, daemon, tmp_path):
    sock = str(tmp_path / "short.sock")
    proc = subprocess.Popen([str(SPDLD), "--socket", sock, "--allow-root", str(daemon.tmp), "--threads", "1",
                             "--log-level", "off"])
    try:
        deadline = time.monotonic() + 10
        while not _connectable(sock):
            assert proc.poll() is None and time.monotonic() < deadline, "spdld did not start"
            time.sleep(0.01)
        loader = spdl_client.Loader(job_yaml(dataset.root, batch=4, prefetch=2), socket=sock, epochs=0)
        it = iter(loader)
        next(it)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        t0 = time.monotonic()
        with pytest.raises(spdl_client.SpdlError) as err:
            for _ in range(1000):
                next(it)
        assert time.monotonic() - t0 < 5
        assert err.value.code == "UNAVAILABLE" and "spdld closed the connection" in str(err.value)
        loader.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_argument_errors_are_python_errors(make_loader, dataset):
    with pytest.raises(ValueError, match="rank 2 is not in"):
        make_loader(rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size"):
        make_loader(world_size=0)
    with pytest.raises(ValueError, match="epochs"):
        make_loader(epochs=-1)
    with pytest.raises(ValueError, match="key.path=value"):
        make_loader(overrides=["batch.size"])
    with pytest.raises(TypeError):
        make_loader(overrides="batch.size=4")
    with pytest.raises(FileNotFoundError, match="no such file"):
        make_loader("does/not/exist.yaml")
    with pytest.raises(TypeError):
        make_loader(42)


def test_spdl_error_is_picklable():
    e = spdl_client.SpdlError("boom", "DATA_LOSS")
    e2 = pickle.loads(pickle.dumps(e))
    assert (str(e2), e2.code, type(e2)) == ("boom", "DATA_LOSS", spdl_client.SpdlError)
