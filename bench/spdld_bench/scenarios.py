"""One measurement: one loader configuration, 1 or N ranks, from a warm page cache to every batch
of every epoch delivered. Returns the figures of that run as a dict (see measure()).

The window of a run: from the moment the trainers are told GO (they have imported everything and
create their loader right after) until the last trainer has its last batch and has shut its
loader down. CPU is counted over that window: each trainer's own (all threads) plus the children
it reaped (DataLoader workers), from os.times() inside the trainer; the daemon's from
/proc/<pid>/stat before GO and after the last trainer exits. The spdl-client CLI has no GO: its
window is its whole life (a C++ binary starts in milliseconds) and its CPU comes from wait4.
"""
import json
import math
import os
import subprocess
import time
from dataclasses import dataclass, field

from . import dataset, procs

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER = os.path.join(HERE, "trainer.py")


@dataclass
class Config:
    key: str          # stable id: "dl-w2-r1", "spdld-py-r4", ...
    label: str        # for tables and plots
    loader: str       # dataloader | spdld-py | spdld-cli | spdl
    ranks: int = 1
    workers: int = 0  # DataLoader num_workers per rank
    threads: int = 2  # spdld --threads, or SPDL pipeline threads
    role: str = ""    # "limit" for the single-thread decode-limit run
    # "": the ranks are ranks of one run (each its own shard). "share" / "noshare": `ranks` identical
    # clients (each rank 0 of 1, the whole dataset), with job config share: true (one pipeline for
    # all) or without (one pipeline each). spdld-cli only.
    identical: str = ""
    # spdld only: job config overrides (KEY=VALUE), e.g. "decode.resample=fast", "source.shards=..."
    sets: list = field(default_factory=list)
    # "": the run's job config; else a key of Env.job_configs: "full" (bench/jobs/full_decode.yaml,
    # the full-decode limit), "shards" (bench/jobs/train_shards.yaml on pre-shrunk tar shards)
    job: str = ""


def clients_samples(env, cfg):
    """Samples all clients of `cfg` receive together."""
    if cfg.identical:
        return expected_samples(env, 1) * cfg.ranks
    return expected_samples(env, cfg.ranks)


@dataclass
class Env:
    python: str
    build_dir: str
    job_config: str
    data_root: str
    dataset_count: int
    epochs: int
    batch: int
    seed: int
    workdir: str
    timeout: float
    pss_interval: float
    spdl_pythonpath: str = ""
    log: callable = print
    recipe: str = "eval"  # trainer.py --recipe: the DataLoader's transforms
    extra_env: dict = field(default_factory=dict)
    # other job configs by Config.job: "full" (the full-decode limit), "shards" (pre-shrunk tar shards)
    job_configs: dict = field(default_factory=dict)

    def config_for(self, cfg):
        return self.job_configs[cfg.job] if cfg.job else self.job_config

    def bin(self, name):
        return os.path.join(self.build_dir, "bin", name)


def expected_samples(env, ranks):
    per_rank = math.ceil(env.dataset_count / ranks)  # spdld pads, DistributedSampler pads
    return per_rank * ranks * env.epochs


def _trainer_cmd(env, cfg, rank, socket=None):
    loader = {"dataloader": "dataloader", "spdld-py": "spdld", "spdl": "spdl"}[cfg.loader]
    cmd = [env.python, TRAINER, "--loader", loader, "--root", env.data_root, "--epochs", str(env.epochs),
           "--batch", str(env.batch), "--seed", str(env.seed), "--rank", str(rank), "--world-size", str(cfg.ranks),
           "--workers", str(cfg.workers), "--threads", str(cfg.threads), "--recipe", env.recipe]
    if socket:
        cmd += ["--socket", socket, "--config", env.config_for(cfg)]
        for kv in cfg.sets:
            cmd += ["--set", kv]
    return cmd


def _recipe_sets(env):
    """spdl-client --set for the recipe: the randaug example trains with batch 256 and drop_last; the
    benchmark measures every loader with its batch size."""
    return ["--set", f"batch.size={env.batch}", "--set", "batch.drop_last=false"] if env.recipe == "randaug" else []


def _trainer_env(env, cfg):
    e = dict(os.environ)
    e.update(env.extra_env)
    paths = []
    if cfg.loader == "spdld-py":
        paths.append(os.path.join(env.build_dir, "python"))
    if cfg.loader == "spdl" and env.spdl_pythonpath:
        paths.append(env.spdl_pythonpath)
    if paths:
        e["PYTHONPATH"] = os.pathsep.join(paths + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    return e


def _tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def _readline(p, timeout, what, errlog):
    """A line from a trainer's stdout within `timeout` (the trainers print very little)."""
    import select
    deadline = time.monotonic() + timeout
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{what}: no line within {timeout:.0f} s")
        r, _, _ = select.select([p.stdout], [], [], left)
        if r:
            c = os.read(p.stdout.fileno(), 1)
            if not c:
                raise RuntimeError(f"{what}: exited ({p.poll()}) before saying READY:\n{_tail(errlog)}")
            buf += c
    return buf.decode().strip()


def measure(env, cfg, rep):
    """Runs `cfg` once. Returns a dict of figures, or raises with what went wrong."""
    warmed = dataset.warm(env.data_root)
    for kv in cfg.sets:  # pre-shrunk shards: warm them too
        if kv.startswith("source.shards="):
            warmed += dataset.warm_shards(os.path.dirname(kv.partition("=")[2]))
    tag = f"{cfg.key}-rep{rep}"
    errlog = os.path.join(env.workdir, f"{tag}.log")
    daemon = None
    if cfg.loader.startswith("spdld"):
        roots = [env.data_root] + [os.path.dirname(kv.partition("=")[2]) for kv in cfg.sets
                                   if kv.startswith("source.shards=")]
        daemon = procs.Daemon(env.bin("spdld"), os.path.join(env.workdir), roots, cfg.threads,
                              os.path.join(env.workdir, f"{tag}.spdld.log"))
    procs_started = []
    try:
        if daemon:
            daemon.__enter__()
        if cfg.loader == "spdld-cli":
            r = _measure_cli(env, cfg, daemon, errlog, procs_started)
        else:
            r = _measure_python(env, cfg, daemon, errlog, procs_started)
        if daemon:
            daemon.stop()
    finally:
        for p in procs_started:
            if p.returncode is None:
                procs.kill_group(p)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        if daemon:
            try:
                daemon.__exit__(None, None, None)
            except RuntimeError:
                pass
    r["warmed_bytes"] = warmed
    r["expected_samples"] = clients_samples(env, cfg)
    if r["samples"] != r["expected_samples"]:
        raise RuntimeError(f"{cfg.label}: delivered {r['samples']} samples, expected {r['expected_samples']}")
    return r


def _stages(stage_lists, samples):
    """The daemon's per-stage counters summed over the ranks' jobs, and busy ms per sample."""
    stages = {}
    for lst in stage_lists:
        for st in lst or []:
            s = stages.setdefault(st["name"], {"tasks": 0, "busy_seconds": 0.0})
            s["tasks"] += st["tasks"]
            s["busy_seconds"] += st["busy_seconds"]
    per = {k: 1e3 * v["busy_seconds"] / samples for k, v in stages.items()} if samples else {}
    return stages, per


def _finish(r, env, window, busy_delta, ours, pss):
    r["window_s"] = window
    r["samples_per_s"] = r["samples"] / r["seconds"] if r["seconds"] > 0 else 0.0
    r["cpu_ms_per_sample"] = 1e3 * r["cpu_s"] / r["samples"] if r["samples"] else float("nan")
    # how many cores the loader kept busy while it delivered (its CPU includes shutting down, a little)
    r["cpu_cores"] = r["cpu_s"] / r["seconds"] if r["seconds"] > 0 else 0.0
    if r.get("cpu_trainer_self_s") is not None and r["seconds"] > 0:
        r["trainer_self_cores"] = r["cpu_trainer_self_s"] / r["seconds"] / max(r.get("ranks", 1), 1)
    r["samples_per_cpu_s"] = r["samples"] / r["cpu_s"] if r["cpu_s"] > 0 else 0.0
    r["peak_pss_mib"] = pss.peak / (1 << 20)
    r["pss_samples"] = pss.samples
    # the CPU the rest of the machine used meanwhile (other processes, hypervisor steal), in cores:
    # busy time minus everything of ours over the same window (the trainers' whole CPU from GO to
    # their exit, shutdown included; the daemon's; this harness's own, the PSS sampler's included)
    r["foreign_cores"] = max(0.0, busy_delta - ours) / window if window > 0 else 0.0
    r["ours_cores"] = ours / window if window > 0 else 0.0
    return r


def _measure_python(env, cfg, daemon, errlog, started):
    socket = daemon.socket if daemon else None
    penv = _trainer_env(env, cfg)
    err = open(errlog, "ab")
    trainers = []
    for rank in range(cfg.ranks):
        p = subprocess.Popen(_trainer_cmd(env, cfg, rank, socket), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=err, env=penv, start_new_session=True)
        started.append(p)
        trainers.append(p)
    err.close()
    for rank, p in enumerate(trainers):
        line = _readline(p, 120, f"{cfg.label} rank {rank}", errlog)
        if line != "READY":
            raise RuntimeError(f"{cfg.label} rank {rank}: said {line!r} instead of READY")
    roots = [p.pid for p in trainers] + ([daemon.pid] if daemon else [])
    pss = procs.PssSampler(roots, interval=env.pss_interval)
    pss.sweep()
    baseline = pss.peak
    baseline_per_root = dict(pss.peak_per_root)
    pss.peak, pss.samples = 0, 0
    pre_go = [procs.cpu_seconds_with_children(p.pid) or 0.0 for p in trainers]  # importing torch etc.
    pss.start()
    d_cpu0 = procs.cpu_seconds(daemon.pid) if daemon else 0.0
    h_cpu0 = procs.self_cpu_seconds()
    busy0 = procs.system_busy_seconds()
    t0 = time.monotonic()
    for p in trainers:
        p.stdin.write(b"GO\n")
        p.stdin.flush()
    results, whole_cpu = [], 0.0
    for rank, p in enumerate(trainers):
        left = env.timeout - (time.monotonic() - t0)
        try:
            code, cpu = procs.wait_rusage(p, max(left, 1))
            whole_cpu += cpu - pre_go[rank]
        except TimeoutError as e:
            raise RuntimeError(f"{cfg.label} rank {rank}: {e}\n{_tail(errlog)}")
        out = p.stdout.read().decode(errors="replace")
        res = [ln[7:] for ln in out.splitlines() if ln.startswith("RESULT ")]
        if code != 0 or not res:
            raise RuntimeError(f"{cfg.label} rank {rank}: exit {code}, no result:\n{_tail(errlog)}")
        results.append(json.loads(res[-1]))
    d_cpu1 = procs.cpu_seconds(daemon.pid) if daemon else 0.0
    busy1 = procs.system_busy_seconds()
    h_cpu1 = procs.self_cpu_seconds()
    t1 = time.monotonic()
    pss.stop()
    start = min(x["t_start"] for x in results)
    end = max(x["t_end"] for x in results)
    cpu_trainers = sum(x["cpu_self_s"] + x["cpu_children_s"] for x in results)
    r = {
        "ranks": cfg.ranks,
        "samples": sum(x["samples"] for x in results),
        "seconds": end - start,
        "cpu_s": cpu_trainers + (d_cpu1 - d_cpu0),
        "cpu_daemon_s": d_cpu1 - d_cpu0,
        "cpu_trainers_s": cpu_trainers,
        "cpu_workers_s": sum(x["cpu_children_s"] for x in results),
        # the trainer processes' own CPU (all their threads, workers excluded): what the loader takes
        # from the process that launches the GPU work
        "cpu_trainer_self_s": sum(x["cpu_self_s"] for x in results),
        "first_batch_s": max(x["t_first"] - x["t_start"] for x in results),
        "wait_s": sum(x["wait_s"] for x in results) / len(results),  # per rank
        "wait_frac": sum(x["wait_s"] / max(x["t_end"] - x["t_start"], 1e-9) for x in results) / len(results),
        "baseline_pss_mib": baseline / (1 << 20),
        "baseline_trainers_pss_mib": sum(v for k, v in baseline_per_root.items() if not daemon or k != daemon.pid)
        / (1 << 20),
        "shapes": sorted({s for x in results for s in x["shapes"]}),
    }
    r["added_pss_mib"] = (pss.peak - baseline) / (1 << 20)
    if daemon:
        r["daemon_peak_pss_mib"] = pss.peak_per_root.get(daemon.pid, 0) / (1 << 20)
        ds = [x.get("daemon_stats") or {} for x in results]
        r["stages"], r["stage_busy_ms_per_sample"] = _stages([d.get("stages") for d in ds], r["samples"])
        fb = [d["first_batch_seconds"] for d in ds if d.get("first_batch_seconds") is not None]
        r["daemon_first_batch_s"] = max(fb) if fb else None
    ours = whole_cpu + (d_cpu1 - d_cpu0) + (h_cpu1 - h_cpu0)
    return _finish(r, env, t1 - t0, busy1 - busy0, ours, pss)


def _measure_cli(env, cfg, daemon, errlog, started):
    pss = procs.PssSampler([daemon.pid], interval=env.pss_interval)
    pss.sweep()
    baseline = pss.peak
    pss.peak, pss.samples = 0, 0
    pss.start()
    d_cpu0 = procs.cpu_seconds(daemon.pid)
    h_cpu0 = procs.self_cpu_seconds()
    busy0 = procs.system_busy_seconds()
    t0 = time.monotonic()
    err = open(errlog, "ab")
    clients = []
    for rank in range(cfg.ranks):
        if cfg.identical:  # the same job N times: rank 0 of 1 each
            shard = ["--rank", "0", "--world-size", "1"]
            if cfg.identical == "share":
                shard += ["--set", "share=true", "--set", f"share_members={cfg.ranks}"]
        else:
            shard = ["--rank", str(rank), "--world-size", str(cfg.ranks)]
        p = subprocess.Popen(
            [env.bin("spdl-client"), "--socket", daemon.socket, "--config", env.config_for(cfg),
             "--set", f"source.root={env.data_root}", "--epochs", str(env.epochs)] + shard + _recipe_sets(env) +
            [x for kv in cfg.sets for x in ("--set", kv)] + ["--json", "--no-checksum", "--quiet"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        started.append(p)
        clients.append(p)
        pss.add_root(p.pid)
    err.close()
    results, cpu_clients = [], 0.0
    for rank, p in enumerate(clients):
        left = env.timeout - (time.monotonic() - t0)
        try:
            code, cpu = procs.wait_rusage(p, max(left, 1))
        except TimeoutError as e:
            raise RuntimeError(f"{cfg.label} rank {rank}: {e}\n{_tail(errlog)}")
        out = p.stdout.read().decode(errors="replace").strip()
        if code != 0 or not out:
            raise RuntimeError(f"{cfg.label} rank {rank}: exit {code}:\n{_tail(errlog)}")
        results.append(json.loads(out.splitlines()[-1]))
        cpu_clients += cpu
    d_cpu1 = procs.cpu_seconds(daemon.pid)
    busy1 = procs.system_busy_seconds()
    h_cpu1 = procs.self_cpu_seconds()
    t1 = time.monotonic()
    pss.stop()
    samples = sum(x["samples"] for x in results)
    stages, stage_ms = _stages([x.get("stages") for x in results], samples)
    r = {
        "samples": samples,
        "seconds": max(x["seconds"] for x in results),
        "cpu_s": cpu_clients + (d_cpu1 - d_cpu0),
        "cpu_daemon_s": d_cpu1 - d_cpu0,
        "cpu_trainers_s": cpu_clients,
        "first_batch_s": max(x["first_batch_s"] for x in results),
        "daemon_first_batch_s": max((x.get("daemon") or {}).get("first_batch_seconds", float("nan")) for x in results),
        "wait_s": None,
        "wait_frac": None,
        "baseline_pss_mib": baseline / (1 << 20),
        "baseline_trainers_pss_mib": 0.0,
        "added_pss_mib": (pss.peak - baseline) / (1 << 20),
        "daemon_peak_pss_mib": pss.peak_per_root.get(daemon.pid, 0) / (1 << 20),
        "stages": stages,
        "stage_busy_ms_per_sample": stage_ms,
    }
    ours = cpu_clients + (d_cpu1 - d_cpu0) + (h_cpu1 - h_cpu0)
    return _finish(r, env, t1 - t0, busy1 - busy0, ours, pss)


def profile_daemon(env, threads, perf="perf"):
    """Runs one 1-rank spdl-client job under `perf record` attached to a fresh daemon; returns
    the flat profile as [(percent, dso, symbol)] and [(percent, dso)], or raises."""
    dataset.warm(env.data_root)
    data = os.path.join(env.workdir, "perf.data")
    with procs.Daemon(env.bin("spdld"), env.workdir, env.data_root, threads,
                      os.path.join(env.workdir, "profile.spdld.log")) as d:
        rec = subprocess.Popen([perf, "record", "-F", "499", "-p", str(d.pid), "-o", data, "--quiet"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        time.sleep(0.5)
        if rec.poll() is not None:
            raise RuntimeError("perf record failed: " + rec.stderr.read().decode(errors="replace")[-300:])
        subprocess.run([env.bin("spdl-client"), "--socket", d.socket, "--config", env.job_config,
                        "--set", f"source.root={env.data_root}", "--epochs", str(env.epochs), "--json",
                        "--no-checksum", "--quiet"] + _recipe_sets(env), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL,
                       timeout=env.timeout, check=True)
        rec.send_signal(2)
        try:
            rec.wait(timeout=60)
        except subprocess.TimeoutExpired:
            procs.kill_group(rec)
            raise RuntimeError("perf record did not stop")

    def report(sort):
        out = subprocess.run([perf, "report", "-i", data, "--stdio", "--no-children", "--sort", sort,
                              "--percent-limit", "0.1"], capture_output=True, text=True, timeout=120).stdout
        rows = []
        for line in out.splitlines():
            line = line.strip()
            if not line or line.startswith("#") or "%" not in line.split()[0]:
                continue
            parts = line.split(None, 1 if sort == "dso" else 2)
            pct = float(parts[0].rstrip("%"))
            if sort == "dso":
                rows.append((pct, parts[1].strip()))
            else:
                dso, _, sym = parts[1].partition(" ")
                if len(parts) > 2:
                    dso, sym = parts[1], parts[2]
                sym = sym.replace("[.] ", "").replace("[k] ", "").strip()
                rows.append((pct, dso, sym))
        return rows

    # a stripped library (Debian's libturbojpeg) shows addresses: one line per library for those
    syms, unresolved = [], {}
    for pct, dso, sym in report("dso,sym"):
        if sym.startswith("0x"):
            unresolved[dso] = unresolved.get(dso, 0.0) + pct
        else:
            syms.append((pct, dso, sym))
    syms += [(pct, dso, "(stripped: no symbols)") for dso, pct in unresolved.items()]
    syms.sort(reverse=True)
    return [x for x in syms if x[0] >= 0.5][:15], [x for x in report("dso") if x[0] >= 0.5][:10]
