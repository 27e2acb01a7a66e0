#!/usr/bin/python3
"""Where spdld's memory goes while N ranks load: the daemon's PSS split into anonymous memory (heap:
decoder scratch, queues, index) and shared memory (the slot rings), the bytes the rings' memfds
actually hold (allocated blocks), and each client's PSS. Samples every 50 ms over one run of N
`spdl-client` ranks (no torch: the clients are the C++ CLI, so what they add is small) and prints
the peak of each figure, the peak of the total that loading adds (the daemon's PSS over its idle PSS
plus the clients' PSS, summed at each sample: the figure to compare with the DataLoader's "PSS
added"), the clients' samples/s and the daemon's CPU time per sample (what a change costs, whatever
else runs on the machine).

  /usr/bin/python3 bench/memory_breakdown.py --build-dir build --ranks 4 [--data DIR] [--config YAML]

Uses the benchmark's ImageNet-like dataset (written by spdl-make-dataset into
~/.cache/spdld-bench/, as run.py does; --data to point elsewhere).
"""
import argparse
import json
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)


def rollup(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                k, _, v = line.partition(":")
                if v.strip().endswith("kB"):
                    out[k.strip()] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def memfd_bytes(pid):
    """Allocated bytes of the memfds the process holds open (the slot rings), and their sizes."""
    alloc = size = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            p = f"/proc/{pid}/fd/{fd}"
            try:
                if "memfd:" not in os.readlink(p):
                    continue
                st = os.stat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                alloc += st.st_blocks * 512
                size += st.st_size
    except OSError:
        pass
    return alloc, size


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--data", help="image folder (default: the benchmark's 2000-file dataset)")
    ap.add_argument("--config", default=os.path.join(REPO, "config", "examples", "imagenet.yaml"))
    a = ap.parse_args()
    from spdld_bench import dataset, procs

    b = os.path.abspath(a.build_dir)
    data = a.data or os.path.expanduser("~/.cache/spdld-bench/data-c10-n200-s7-250-650-q96")
    if not a.data:
        dataset.make(os.path.join(b, "bin", "spdl-make-dataset"), data, 10, 200, 7, 250, 650, 96)
    dataset.warm(data)
    work = tempfile.mkdtemp(prefix="spdld-mem-")
    peak = {}

    def keep(k, v):
        peak[k] = max(peak.get(k, 0), v)

    with procs.Daemon(os.path.join(b, "bin", "spdld"), work, data, a.threads, os.path.join(work, "spdld.log")) as d:
        time.sleep(0.3)
        idle = rollup(d.pid)
        cpu0 = procs.cpu_seconds(d.pid)
        clients = [subprocess.Popen([os.path.join(b, "bin", "spdl-client"), "--socket", d.socket, "--config", a.config,
                                     "--set", f"source.root={data}", "--epochs", str(a.epochs), "--rank", str(r),
                                     "--world-size", str(a.ranks), "--json", "--no-checksum", "--quiet"],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for r in range(a.ranks)]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                r = rollup(d.pid)
                keep("daemon Pss", r.get("Pss", 0))
                keep("daemon Pss_Anon", r.get("Pss_Anon", 0))
                keep("daemon Pss_Shmem", r.get("Pss_Shmem", 0))
                keep("daemon Rss", r.get("Rss", 0))
                alloc, size = memfd_bytes(d.pid)
                keep("rings allocated (memfd blocks)", alloc)
                keep("rings size (memfd st_size)", size)
                cpss = sum(rollup(c.pid).get("Pss", 0) for c in clients)
                keep("clients Pss", cpss)
                keep("added (daemon over idle + clients)", r.get("Pss", 0) - idle.get("Pss", 0) + cpss)
                stop.wait(0.05)

        t = threading.Thread(target=sample)
        t.start()
        t0 = time.monotonic()
        outs = [c.communicate()[0] for c in clients]
        wall = time.monotonic() - t0
        daemon_cpu = procs.cpu_seconds(d.pid) - cpu0
        codes = [c.returncode for c in clients]
        stop.set()
        t.join()
    mib = 1 << 20
    print(f"ranks {a.ranks}, threads {a.threads}, clients exit {codes}")
    print(f"daemon idle: Pss {idle.get('Pss', 0) / mib:.1f} MiB, Pss_Anon {idle.get('Pss_Anon', 0) / mib:.1f} MiB")
    for k, v in peak.items():
        print(f"peak {k}: {v / mib:.1f} MiB")
    samples = 0
    for o in outs:
        try:
            samples += json.loads(o.decode().strip().splitlines()[-1]).get("samples", 0)
        except (ValueError, IndexError):
            pass
    print(f"samples {samples} in {wall:.1f} s: {samples / wall:.0f} samples/s (all ranks, from the clients' start)")
    if samples:
        print(f"daemon CPU: {daemon_cpu:.2f} s, {1000 * daemon_cpu / samples:.2f} ms per sample")
    with open("/proc/loadavg") as f:
        print(f"load average after: {' '.join(f.read().split()[:3])}")
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
