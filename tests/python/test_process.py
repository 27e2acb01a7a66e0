"""Tests that run a Python child process: the GIL while waiting for a batch, and the example."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, SMALL, job_yaml, subprocess_env

# The child holds the only slot (prefetch: 1) and waits for the next batch on its main thread; a
# second thread counts in a busy loop for 0.5 s, then drops the held batch. The wait can only end if
# next() released the GIL: with the GIL held, the counting thread could never run, nor release.
GIL_CHILD = textwrap.dedent(
    """
    import json, sys, threading, time
    import spdl_client

    loader = spdl_client.Loader(sys.argv[1], socket=sys.argv[2], epochs=0)
    it = iter(loader)
    held = [next(it)]
    counts = {"during": 0}
    waiting = threading.Event()

    def busy():
        waiting.wait()
        t_end = time.monotonic() + 0.5
        n = 0
        while time.monotonic() < t_end:
            n += 1
        counts["during"] = n
        held.clear()  # the slot goes back: the main thread's next() can return

    t = threading.Thread(target=busy)
    t.start()
    t0 = time.monotonic()
    waiting.set()
    batch = next(it)
    waited = time.monotonic() - t0
    t.join()
    print(json.dumps({"waited": waited, "during": counts["during"], "seq": batch.seq}))
    loader.close()
    """
)


def test_the_gil_is_released_while_waiting_for_a_batch(daemon, dataset):
    proc = subprocess.run(
        [sys.executable, "-c", GIL_CHILD, job_yaml(dataset.root, batch=4, prefetch=1), daemon.socket],
        env=subprocess_env(), capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["seq"] == 1
    assert out["waited"] >= 0.45  # it really waited for the other thread's release
    assert out["during"] > 10_000, out  # and that thread ran freely meanwhile


def test_the_example_trains_a_few_steps(daemon, dataset):
    pytest.importorskip("torch", reason="the example trains with torch; torch is not installed here")
    cmd = [sys.executable, str(REPO / "client/python/examples/train_cnn.py"), "--data", str(dataset.root),
           "--max-steps", "3", "--batch-size", "8", "--num-classes", "4", "--log-every", "1"]
    for k, v in SMALL.items():
        cmd += ["--set", f"{k}={v}"]
    proc = subprocess.run(cmd, env=subprocess_env(SPDLD_SOCKET=daemon.socket, RANK=0, WORLD_SIZE=1),
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "step 3: loss" in proc.stdout and "3 steps, 24 samples" in proc.stdout, proc.stdout
