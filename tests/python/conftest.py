"""Fixtures for the spdl_client tests: a real JPEG dataset and a real spdld process.

The build is found through $SPDL_BUILD_DIR (default <repo>/build): its bin/spdld,
bin/spdl-make-dataset and python/spdl_client (the extension built by the `spdl_python` target).
Nothing is skipped when the build is missing: the run stops at once with a message saying what to
build. Set SPDL_TEST_INSTALLED=1 to test an installed spdl_client (pip) instead of the build tree's.
"""

from __future__ import annotations

import json
import os
import signal
import socket as socketlib
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("SPDL_BUILD_DIR") or REPO / "build").resolve()
SPDLD = BUILD / "bin" / "spdld"
MAKE_DATASET = BUILD / "bin" / "spdl-make-dataset"
PY_DIR = BUILD / "python"
USE_INSTALLED = os.environ.get("SPDL_TEST_INSTALLED") == "1"

# The dataset every test reads: 4 classes x 12 small JPEGs (48 files).
CLASSES = 4
PER_CLASS = 12
# Small transforms keep the whole run to seconds on two cores.
SMALL = {"transforms.0.resize.shorter": 64, "transforms.1.center_crop.size": 56}


def _check_build() -> None:
    problems = [f"{p} is missing" for p in (SPDLD, MAKE_DATASET) if not p.is_file()]
    if not USE_INSTALLED:
        if not list((PY_DIR / "spdl_client").glob("_spdl_client*.so")):
            problems.append(f"{PY_DIR}/spdl_client/_spdl_client*.so is missing (target spdl_python)")
        else:
            sys.path.insert(0, str(PY_DIR))
    if problems:
        raise pytest.UsageError(
            "the spdl_client tests need a build of spdld and the Python binding in "
            f"SPDL_BUILD_DIR={BUILD}:\n  " + "\n  ".join(problems) + "\n"
            f"build them with: cmake -S {REPO} -B {BUILD} -G Ninja -DPython3_EXECUTABLE={sys.executable} && "
            f"ninja -C {BUILD} spdld spdl-make-dataset spdl_python\n"
            "(or point SPDL_BUILD_DIR at another build directory)"
        )
    try:
        import spdl_client  # noqa: F401
    except ImportError as e:
        raise pytest.UsageError(f"cannot import spdl_client ({e}); interpreter {sys.executable}") from e


def pytest_configure(config) -> None:
    _check_build()


def pytest_report_header(config):
    import spdl_client

    return [f"spdl build: {BUILD}", f"spdl_client: {Path(spdl_client.__file__).parent}"]


@dataclass
class Dataset:
    root: Path
    files: list = field(default_factory=list)  # paths relative to root, "class_000/img_00000.jpg"
    label_of: dict = field(default_factory=dict)  # relative path -> label (index of the sorted class folder)


@dataclass
class Daemon:
    socket: str
    tmp: Path  # the daemon's only allowed root; the dataset is below it
    proc: subprocess.Popen


def _connectable(path: str) -> bool:
    s = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class SpdldProcess:
    """A spdld of a test module's own, started from a config file, for settings the session's
    `daemon` lacks (allowed URL prefixes, caches...): allowed the root `tmp`, with the given
    settings; its files in tmp: NAME.sock, NAME-spdld.yaml, spdld-NAME.log (appended to: a restart
    under the same name keeps the earlier log). Not thread-safe.
    REQUIRES: url_prefixes are URLs (written as a JSON list: YAML reads it)."""

    def __init__(self, tmp: Path, name: str, url_prefixes: tuple = (), *, worker_threads: int = 2,
                 io_threads: int = 4, log_level: str = "info", extra: str = "") -> None:
        self.sock = str(tmp / f"{name}.sock")
        self.logpath = tmp / f"spdld-{name}.log"
        cfg = tmp / f"{name}-spdld.yaml"
        cfg.write_text(f"socket_path: {self.sock}\nallowed_roots: [{tmp}]\n"
                       f"allowed_url_prefixes: {json.dumps(list(url_prefixes))}\nworker_threads: {worker_threads}\n"
                       f"io_threads: {io_threads}\nlog_level: {log_level}\n{extra}")
        self.log = open(self.logpath, "ab")
        self.proc = subprocess.Popen([str(SPDLD), "--config", str(cfg)], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not _connectable(self.sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                self.log.close()
                raise AssertionError(f"spdld {name} did not start (exit {self.proc.returncode}):\n"
                                     f"{self.logpath.read_text()}")
            time.sleep(0.01)

    def stop(self) -> None:
        """SIGTERM; asserts a clean exit (0) within 20 s, killing it otherwise."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            assert self.proc.wait(timeout=20) == 0, self.logpath.read_text()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log.close()


@pytest.fixture(scope="session")
def tmp_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("spdl")


@pytest.fixture(scope="session")
def dataset(tmp_root) -> Dataset:
    root = tmp_root / "data"
    subprocess.run(
        [str(MAKE_DATASET), str(root), "--classes", str(CLASSES), "--per-class", str(PER_CLASS),
         "--min-side", "64", "--max-side", "160"],
        check=True, stdout=subprocess.DEVNULL,
    )
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    ds = Dataset(root=root)
    for label, cls in enumerate(classes):
        for f in sorted((root / cls).iterdir()):
            rel = f"{cls}/{f.name}"
            ds.files.append(rel)
            ds.label_of[rel] = label
    assert len(ds.files) == CLASSES * PER_CLASS, ds.files
    return ds


@pytest.fixture(scope="session")
def daemon(tmp_root, dataset) -> Daemon:
    sock = str(tmp_root / "s.sock")
    log = open(tmp_root / "spdld.log", "wb")
    proc = subprocess.Popen(
        [str(SPDLD), "--socket", sock, "--allow-root", str(tmp_root), "--threads", "2", "--log-level", "warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while not _connectable(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            log.close()
            pytest.fail(f"spdld did not start (exit {proc.returncode}):\n{(tmp_root / 'spdld.log').read_text()}")
        time.sleep(0.01)
    yield Daemon(socket=sock, tmp=tmp_root, proc=proc)
    # Every test is done: the daemon must still be alive and shut down cleanly on SIGTERM.
    assert proc.poll() is None, f"spdld died during the tests (exit {proc.returncode})"
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = "none: killed after 10 s"
    log.close()
    assert code == 0, f"spdld exit code {code} after SIGTERM; its log:\n{(tmp_root / 'spdld.log').read_text()}"


def job_yaml(root, *, batch: int = 8, prefetch: int = 2, shuffle: bool = True, seed: int = 7, extra: str = "") -> str:
    """A small job config as YAML text (64 -> 56 pixel images)."""
    return (
        f"source: {{type: image_folder, root: {root}}}\n"
        f"sampler: {{shuffle: {'true' if shuffle else 'false'}, seed: {seed}}}\n"
        f"batch: {{size: {batch}, drop_last: false}}\n"
        "transforms:\n"
        "  - resize: {shorter: 64}\n"
        "  - center_crop: {size: 56}\n"
        f"prefetch: {prefetch}\n"
        f"{extra}"
    )


@pytest.fixture
def make_loader(daemon, dataset):
    """make_loader(**kw) -> an open spdl_client.Loader on the test daemon and dataset, closed after
    the test. Keywords: those of Loader, plus batch / prefetch / shuffle / seed / extra for the
    job's YAML (unless `config` is given)."""
    import spdl_client

    loaders = []

    def make(config=None, *, batch=8, prefetch=2, shuffle=True, seed=7, extra="", **kw):
        if config is None:
            config = job_yaml(dataset.root, batch=batch, prefetch=prefetch, shuffle=shuffle, seed=seed, extra=extra)
        kw.setdefault("socket", daemon.socket)
        kw.setdefault("rank", 0)
        kw.setdefault("world_size", 1)
        loader = spdl_client.Loader(config, **kw)
        loaders.append(loader)
        return loader

    yield make
    for loader in loaders:
        loader.close()


def subprocess_env(**extra) -> dict:
    """The environment for a Python child process that imports the same spdl_client."""
    env = dict(os.environ)
    if not USE_INSTALLED:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PY_DIR), env.get("PYTHONPATH")]))
    env.update({k: str(v) for k, v in extra.items()})
    return env


# A test that hangs (e.g. waiting for a slot that never comes back) must not hang CI: after this
# long, print the test's name and every thread's stack to the real stderr (pytest's capture is
# suspended first: a dump into the captured output would be lost with the process) and exit. (A
# signal cannot interrupt a wait inside the client library, so pytest-timeout's signal method would
# not help either.) If even that watchdog thread cannot run (the GIL held by a stuck thread),
# faulthandler's own thread dumps and exits a little later. SPDL_TEST_TIMEOUT_S overrides the limit.
TEST_TIMEOUT_S = float(os.environ.get("SPDL_TEST_TIMEOUT_S", "60"))


@pytest.fixture(autouse=True)
def _watchdog(request):
    import faulthandler
    import threading

    capman = request.config.pluginmanager.getplugin("capturemanager")

    def expire():
        if capman is not None:
            capman.suspend_global_capture(in_=True)
        sys.stderr.write(f"\nwatchdog: {request.node.nodeid} still running after {TEST_TIMEOUT_S:g} s; "
                         "every thread's stack:\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(1)

    timer = threading.Timer(TEST_TIMEOUT_S, expire)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(TEST_TIMEOUT_S + 15, exit=True)
    yield
    timer.cancel()
    faulthandler.cancel_dump_traceback_later()
