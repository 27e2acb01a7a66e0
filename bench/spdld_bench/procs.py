"""Reading processes from /proc, and starting and stopping the ones a measurement needs.

Not thread-safe unless said otherwise; PssSampler runs its own thread and is read after stop().
"""
import os
import resource
import signal
import subprocess
import threading
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1


def cpu_seconds(pid):
    """utime + stime of a live process (all its threads), in seconds; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # after the ")" of comm: state is field 3, utime field 14, stime field 15 (1-based in proc(5))
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_seconds_with_children(pid):
    """utime + stime + cutime + cstime of a live process: its own CPU and that of the children it
    has reaped so far, in seconds; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return sum(int(x) for x in fields[11:15]) / CLK_TCK


def self_cpu_seconds():
    """CPU of this process (every thread, the PSS sampler's included)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def system_busy_seconds():
    """CPU seconds all CPUs spent busy since boot (user+nice+system+irq+softirq+steal)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def pss_bytes(pid):
    """Proportional set size of a process (shared pages split among their mappers); 0 if gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def children_map():
    """ppid -> [pid] for every process on the machine (one pass over /proc)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out.setdefault(ppid, []).append(int(name))
    return out


def tree(pid, kids=None):
    """pid and its live descendants."""
    kids = children_map() if kids is None else kids
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def total_pss(roots):
    """Sum of the PSS of every process in the trees of `roots`, and per root."""
    kids = children_map()
    per = {}
    for r in roots:
        per[r] = sum(pss_bytes(p) for p in tree(r, kids))
    return sum(per.values()), per


class PssSampler:
    """Samples the summed PSS of some process trees on its own thread and keeps the peak.

    Reading smaps_rollup of a process that has torch loaded costs ~2 ms of CPU, so with 20
    processes one sweep is ~40 ms: the thread waits at least `duty` times its own sweep time
    between sweeps (a 10% duty cycle by default), so that it takes little from the loaders it
    measures, yet keeps its normal priority so that a loaded machine does not starve it of samples.
    A process that exits during a sweep counts 0 (a sweep never over-counts). Roots can be added
    while it runs.
    """

    def __init__(self, roots, interval=0.1, duty=10.0):
        self._roots = list(roots)
        self._interval = interval
        self._duty = duty
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.peak = 0
        self.peak_per_root = {}
        self.samples = 0
        self.sweep_seconds = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add_root(self, pid):
        with self._lock:
            self._roots.append(pid)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()
        self.sweep()  # one last look

    def sweep(self):
        with self._lock:
            roots = list(self._roots)
        total, per = total_pss(roots)
        if total > self.peak:
            self.peak = total
            self.peak_per_root = per
        self.samples += 1

    def _run(self):
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.sweep()
            dt = time.monotonic() - t0
            self.sweep_seconds += dt
            self._stop.wait(max(self._interval, self._duty * dt))


def kill_group(p, sig=signal.SIGKILL):
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_rusage(p, timeout):
    """Waits for a Popen child with wait4, so its CPU (and that of the children it reaped) is
    known exactly. Returns (exit code, cpu seconds); kills its process group on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            return p.returncode, ru.ru_utime + ru.ru_stime
        if time.monotonic() > deadline:
            kill_group(p)
            _, status, ru = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            raise TimeoutError(f"pid {p.pid} ran past {timeout:.0f} s and was killed")
        time.sleep(0.01)


class Daemon:
    """A fresh spdld on its own socket in `workdir`, stopped with SIGTERM. A context manager."""

    def __init__(self, binary, workdir, allow_root, threads, log_path):
        self.binary = binary
        self.socket = os.path.join(workdir, "spdld.sock")
        self.allow_root = allow_root
        self.threads = threads
        self.log_path = log_path
        self.proc = None
        self.exit_code = None

    def __enter__(self):
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.binary, "--socket", self.socket] +
            [x for r in (self.allow_root if isinstance(self.allow_root, (list, tuple)) else [self.allow_root])
             for x in ("--allow-root", r)] + [
             "--threads", str(self.threads), "--log-level", "warn"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 20
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None:
                raise RuntimeError(f"spdld exited with {self.proc.returncode} at start; see {self.log_path}")
            if time.monotonic() > deadline:
                kill_group(self.proc)
                raise RuntimeError(f"spdld did not create {self.socket} within 20 s; see {self.log_path}")
            time.sleep(0.01)
        return self

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.exit_code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            self.proc.wait()
            raise RuntimeError(f"spdld did not stop within 20 s of SIGTERM; see {self.log_path}")
        if self.exit_code != 0:
            raise RuntimeError(f"spdld exited with {self.exit_code} after SIGTERM; see {self.log_path}")

    def __exit__(self, *exc):
        try:
            self.stop()
        except RuntimeError:
            if exc[0] is None:
                raise
        return False
