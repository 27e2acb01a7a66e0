"""Waits of spdl_client.Loader: the read timeout (a clear error naming the job and what it waited
for) and Ctrl-C (KeyboardInterrupt within 0.5 s, nothing left behind), against a real spdld whose
job reads from an HTTP server that accepts connections and never answers."""

from __future__ import annotations

import json
import os
import signal
import socket as socketlib
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import spdl_client
from conftest import BUILD, SpdldProcess, subprocess_env

SPDLCTL = BUILD / "bin" / "spdlctl"


class SilentServer:
    """A TCP or Unix stream server that accepts every connection and never sends a byte."""

    def __init__(self, family=socketlib.AF_INET, address=("127.0.0.1", 0)) -> None:
        self.sock = socketlib.socket(family, socketlib.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(64)
        self.address = self.sock.getsockname()
        self.conns: list = []
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
                self.conns.append(conn)
            except OSError:
                continue

    def open_connections(self) -> int:
        """Connections whose peer has not closed them."""
        n = 0
        for c in self.conns:
            c.setblocking(False)
            try:
                while c.recv(65536):  # what the peer sent, then EOF (b"") once it closed
                    pass
            except BlockingIOError:
                n += 1  # nothing more to read, and no EOF: still open
            except OSError:
                pass
        return n

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.fixture(scope="module")
def stalled(tmp_root):
    """(spdld socket, job YAML): a daemon allowed to fetch from a local HTTP server that never
    answers, and a job reading 4 images from it (each request times out after 5 s)."""
    server = SilentServer()
    host, port = server.address
    prefix = f"http://{host}:{port}"
    urls = tmp_root / "stalled-urls.txt"
    urls.write_text("".join(f"{prefix}/img{i}.jpg,{i % 2}\n" for i in range(4)))
    d = SpdldProcess(tmp_root, "stalled", [prefix], worker_threads=1, io_threads=4, log_level="warn",
                     extra="drain_seconds: 10\n")
    job = (
        f"source: {{type: http, list: {urls}, timeout_ms: 5000, max_attempts: 1}}\n"
        "batch: {size: 2}\nprefetch: 2\n"
        "transforms:\n  - resize: {shorter: 64}\n  - center_crop: {size: 56}\n"
    )
    yield d.sock, job
    try:
        d.stop()
    finally:
        server.close()


def daemon_status(sock: str) -> dict:
    out = subprocess.run([str(SPDLCTL), "--socket", sock, "--json", "status"], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    return json.loads(out)


def wait_until_no_jobs(sock: str) -> dict:
    deadline = time.monotonic() + 15  # a worker blocked on the silent server holds the job <= 5 s
    while True:
        st = daemon_status(sock)
        if int(st.get("live_jobs", 0)) == 0 and int(st.get("memory_in_use_bytes", 0)) == 0:
            return st
        assert time.monotonic() < deadline, f"the daemon still holds a job: {st}"
        time.sleep(0.1)


def test_a_read_timeout_names_the_job_and_what_it_waited_for(stalled):
    sock, job = stalled
    loader = spdl_client.Loader(job, socket=sock, timeout=0.5)
    it = iter(loader)
    t0 = time.monotonic()
    with pytest.raises(spdl_client.SpdlTimeoutError) as err:
        next(it)
    waited = time.monotonic() - t0
    assert 0.5 <= waited < 3, waited
    e = err.value
    assert isinstance(e, TimeoutError) and isinstance(e, spdl_client.SpdlError) and e.code == "DEADLINE_EXCEEDED"
    msg = str(e)
    assert f"job {loader.info['job_id']}" in msg and "batch 0 of epoch 0" in msg and "0.5 s" in msg, msg
    # Nothing was lost: the iterator is still usable, with a per-call timeout.
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        it.next(timeout=0.2)
    assert 0.2 <= time.monotonic() - t0 < 2
    with pytest.raises(ValueError, match="timeout"):
        it.next(timeout=-1)
    loader.close()
    wait_until_no_jobs(sock)


def test_open_times_out_on_a_daemon_that_never_answers(tmp_path):
    server = SilentServer(socketlib.AF_UNIX, str(tmp_path / "silent.sock"))
    try:
        t0 = time.monotonic()
        with pytest.raises(spdl_client.SpdlTimeoutError, match="did not accept the job"):
            spdl_client.Loader("source: {root: /x}\n", socket=str(tmp_path / "silent.sock"), timeout=0.3)
        assert 0.3 <= time.monotonic() - t0 < 2
        deadline = time.monotonic() + 5
        while server.open_connections():  # the client hung up: no socket left behind
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        server.close()


# The child blocks in next() (or in opening the job), prints "waiting", and reports when the
# KeyboardInterrupt arrived, the batches it still held and its open sockets after closing the loader.
CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import spdl_client

    # A process started with SIGINT ignored (a background job of a non-interactive shell, as CI
    # may start the suite) inherits that, and Python then installs no KeyboardInterrupt handler:
    # restore Python's own so that the test does not depend on how the suite was started.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def sockets():
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
            except OSError:
                pass
        return n

    mode, config, sock = sys.argv[1:4]
    loader = None
    try:
        if mode == "next":
            loader = spdl_client.Loader(config, socket=sock, timeout=60)
            it = iter(loader)
            print("waiting", flush=True)
            next(it)
        else:
            print("waiting", flush=True)
            loader = spdl_client.Loader(config, socket=sock, timeout=60)
        print(json.dumps({"error": "no KeyboardInterrupt"}), flush=True)
    except KeyboardInterrupt:
        at = time.monotonic()
        held = loader.held_batches if loader else 0
        if loader:
            loader.close()
        print(json.dumps({"at": at, "held": held, "sockets": sockets()}), flush=True)
    """
)


def interrupt_child(mode: str, config: str, sock: str) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode, config, sock], env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "waiting", proc.stderr.read()
        time.sleep(0.5)  # well inside the wait
        assert proc.poll() is None
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        line = proc.stdout.readline()
        if not line:  # the child ended without a report: say how, with what it printed
            rc = proc.wait(timeout=10)
            raise AssertionError(f"the child exited {rc} without a report; stderr:\n{proc.stderr.read()}")
        report = json.loads(line)
        assert proc.wait(timeout=10) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "error" not in report, report
    report["latency"] = report["at"] - sent  # CLOCK_MONOTONIC: one clock for both processes
    print(f"Ctrl-C in {mode}: KeyboardInterrupt after {report['latency'] * 1000:.1f} ms")  # shown with -s
    return report


def test_ctrl_c_in_next_raises_keyboardinterrupt_within_half_a_second(stalled):
    sock, job = stalled
    report = interrupt_child("next", job, sock)
    assert 0 <= report["latency"] < 0.5, report
    assert report["held"] == 0 and report["sockets"] == 0, report
    wait_until_no_jobs(sock)  # the daemon dropped the job and its slots


def test_ctrl_c_while_opening_the_job(tmp_path):
    server = SilentServer(socketlib.AF_UNIX, str(tmp_path / "silent.sock"))
    try:
        report = interrupt_child("open", "source: {root: /x}\n", str(tmp_path / "silent.sock"))
        assert 0 <= report["latency"] < 0.5 and report["sockets"] == 0, report
        assert server.open_connections() == 0
    finally:
        server.close()
