#!/usr/bin/python3
"""spdld vs PyTorch's DataLoader (and SPDL, when it installs) on the same JPEGs, the same
transform and the same batch size, in one run. Writes RESULTS.md, results.png and results.json.

  /usr/bin/python3 bench/run.py --build-dir build --out bench           # full run, ~15 min on 2 cores
  /usr/bin/python3 bench/run.py --build-dir build --out bench/out --quick   # ~2 min smoke run

Needs spdld, spdl-client and spdl-make-dataset in BUILD/bin, torch + torchvision + PIL +
matplotlib in this Python (Debian's /usr/bin/python3 has them), and for the Python-client path the
spdl_client module in BUILD/python. See bench/README.md for what is measured and how.
Exit status: 0 every run succeeded, 1 some run failed (the report lists it), 2 cannot start.
"""
import argparse
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def probe(python, code, pythonpath=None, timeout=120):
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        p = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, "timed out"
    if p.returncode == 0:
        return True, p.stdout.strip()
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    return False, lines[-1] if lines else f"exit {p.returncode}"


def find_python_client(python, build_dir):
    path = os.path.join(build_dir, "python")
    ok, msg = probe(python, "import spdl_client; print(getattr(spdl_client, '__file__', '?'))", path)
    if ok:
        return True, f"measured, `spdl_client` from `{msg}`."
    return False, (f"**not measured**: `import spdl_client` with PYTHONPATH={path} failed ({msg}); build it "
                   f"(`ninja -C {build_dir} spdl_python`) and rerun. The spdl-client CLI path stands in for it.")


def find_spdl(python, cache, allow_install):
    code = "import spdl.io, spdl.pipeline, importlib.metadata as m; print(m.version('spdl_io'))"
    ok, msg = probe(python, code, cache)
    how = "already installed"
    if not ok and allow_install:
        log("SPDL: not importable; trying `pip install --no-deps --target` from PyPI")
        try:
            p = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                                "--target", cache, "spdl", "spdl_core", "spdl_io"],
                               capture_output=True, text=True, timeout=300)
            if p.returncode != 0:
                return None, f"skipped: `pip install spdl` failed here: {(p.stderr.strip().splitlines() or ['?'])[-1]}"
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"skipped: `pip install spdl` failed here: {e}"
        ok, msg = probe(python, code, cache)
        how = "installed from PyPI with `pip install --no-deps --target` (its one dependency, numpy, is Debian's)"
    if not ok:
        return None, f"skipped: SPDL is not importable ({msg})" + ("" if allow_install else " and --spdl off")
    return cache, (f"spdl_io {msg}, {how}: its thread-based pipeline (`spdl.pipeline.PipelineBuilder`), per image "
                   "read + `spdl.io.demux_image` + `decode_packets` with an FFmpeg filter (scale the shorter side to "
                   "256, bilinear, crop 224, rgb24; one FFmpeg thread per image) on a pool of threads = cores, "
                   "`aggregate(32)`, `convert_frames` into one NHWC batch, sink buffer 4; 1 rank only.")


def build_configs(a, have_py, have_spdl, have_shards=False):
    from spdld_bench.scenarios import Config
    out = []
    train = a.recipe == "train"
    for ranks in a.ranks:
        for w in a.workers:
            out.append(Config(f"dl-w{w}-r{ranks}", f"DataLoader num_workers={w}", "dataloader", ranks, workers=w))
        if have_py:
            out.append(Config(f"spdld-py-r{ranks}", "spdld + Python client", "spdld-py", ranks, threads=a.threads))
        out.append(Config(f"spdld-cli-r{ranks}", "spdld + spdl-client (C++)", "spdld-cli", ranks, threads=a.threads))
        if have_spdl and ranks == 1:
            out.append(Config(f"spdl-r{ranks}", f"SPDL, {a.threads} threads", "spdl", ranks, threads=a.threads))
        if train and ranks == 1 and have_py:
            out.append(Config(f"spdld-py-fast-r{ranks}", "spdld + Python client, resample: fast (DCT-scaled decode)",
                              "spdld-py", ranks, threads=a.threads, sets=["decode.resample=fast"]))
        if train and ranks == 1 and have_py and have_shards:
            out.append(Config(f"spdld-py-shards-r{ranks}", f"spdld + Python client, tar shards pre-shrunk to "
                              f"--max-side {a.shard_max_side}", "spdld-py", ranks, threads=a.threads, job="shards",
                              role="shards", sets=[f"source.shards={a.shards_pattern}"]))
        if train and ranks == 1 and have_py and a.decoded_cache:
            out.append(Config(f"spdld-py-dcache-r{ranks}", f"spdld + Python client, cache.decoded max_side "
                              f"{a.decoded_cache} (epoch 1 decodes and shrinks, later epochs decode no JPEG)",
                              "spdld-py", ranks, threads=a.threads, sets=[f"cache.decoded.max_side={a.decoded_cache}"]))
    for n in a.identical:
        out.append(Config(f"spdld-cli-same{n}-noshare", f"{n} identical spdl-client jobs, no sharing", "spdld-cli", n,
                          threads=a.threads, role="identical", identical="noshare"))
        out.append(Config(f"spdld-cli-same{n}-share", f"{n} identical spdl-client jobs, share: true", "spdld-cli", n,
                          threads=a.threads, role="identical", identical="share"))
    out.append(Config("spdld-cli-t1-r1", "spdld --threads 1 + spdl-client", "spdld-cli", 1, threads=1, role="limit"))
    if train:  # the full-decode limit: the same, on a job that needs every pixel of every image
        out.append(Config("spdld-cli-t1-full-r1", "spdld --threads 1 + spdl-client, full decode (whole image to 224x224)",
                          "spdld-cli", 1, threads=1, role="limit-full", job="full"))
    return out


def job_prefetch(path):
    """The job config's `prefetch` (slots per rank), for the ring size in the report."""
    try:
        import yaml
        with open(path) as f:
            return int((yaml.safe_load(f) or {}).get("prefetch", 4))
    except Exception:  # the report says n/a rather than failing the whole run
        return None


OPS_BEGIN, OPS_END = "<!-- spdl-ops-bench:begin -->", "<!-- spdl-ops-bench:end -->"
MEM_BEGIN, MEM_END = "<!-- memory-breakdown:begin -->", "<!-- memory-breakdown:end -->"


def write_outputs(out, data, report):
    """Writes results.png and RESULTS.md; the sections this script does not measure (the memory
    breakdown, from bench/memory_breakdown.py runs, and the per-operation figures of
    bench/ops/run_ops.py), each between its markers in an existing RESULTS.md, are carried over
    unchanged."""
    os.makedirs(out, exist_ok=True)
    report.plot(os.path.join(out, "results.png"), data)
    path = os.path.join(out, "RESULTS.md")
    ops = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
        for begin, end in ((MEM_BEGIN, MEM_END), (OPS_BEGIN, OPS_END)):
            if begin in old and end in old:
                ops += old[old.index(begin):old.index(end) + len(end)] + "\n\n"
        ops = ops.rstrip("\n") + "\n" if ops else ""
    with open(path, "w") as f:
        f.write(report.write_markdown(data, "results.png").rstrip("\n") + "\n" + ("\n" + ops if ops else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build", help="the CMake build directory (holds bin/, python/)")
    ap.add_argument("--out", help="where RESULTS.md, results.png, results.json go (default: bench/, "
                    "or bench/out/ with --quick)")
    ap.add_argument("--quick", action="store_true", help="~2 min smoke run: small dataset, one repeat")
    ap.add_argument("--classes", type=int, help="dataset classes (default 10; quick 4)")
    ap.add_argument("--per-class", type=int, help="images per class (default 200; quick 80)")
    ap.add_argument("--min-side", type=int, default=250, help="spdl-make-dataset --min-side")
    ap.add_argument("--max-side", type=int, default=650, help="spdl-make-dataset --max-side")
    ap.add_argument("--quality", type=int, default=96, help="spdl-make-dataset --quality")
    ap.add_argument("--seed", type=int, default=7, help="dataset seed")
    ap.add_argument("--epochs", type=int, default=2, help="epochs per run")
    ap.add_argument("--repeats", type=int, help="runs per configuration; the median is reported (default 3; quick 1)")
    ap.add_argument("--workers", default="1,2,3,4", help="DataLoader num_workers values to try")
    ap.add_argument("--ranks", default="1,4,8", help="scenarios: ranks on the node")
    ap.add_argument("--identical", default="4",
                    help="scenarios: N identical spdl-client jobs with and without share: true (comma list; '' = none)")
    ap.add_argument("--threads", type=int, default=2, help="spdld --threads (and SPDL's)")
    ap.add_argument("--job-config", help="spdld's job config (default: config/examples/imagenet.yaml, or "
                                         "imagenet_train_randaug.yaml with --recipe randaug)")
    ap.add_argument("--recipe", choices=["eval", "train", "randaug"], default="eval",
                    help="eval: Resize 256 + CenterCrop 224; train: RandomResizedCrop 224 + RandomHorizontalFlip, uint8 "
                         "(spdld: bench/jobs/train.yaml; plus its resample: fast variant, pre-shrunk shards and the "
                         "full-decode limit); randaug: RandomResizedCrop, flip, RandAugment(2, 9), normalize, "
                         "RandomErasing (the DataLoader's torchvision recipe; SPDL is not measured)")
    ap.add_argument("--dataset", choices=["imagenet", "large"], default="imagenet",
                    help="imagenet: spdl-make-dataset, ImageNet-like sizes; large: photograph-like JPEGs with sides "
                         "1500-4000 px (tests/python/photos.py; default 3 classes x 10)")
    ap.add_argument("--shard-max-side", type=int, default=320,
                    help="train: also measure tar shards written by spdl-shard --max-side N (0: not)")
    ap.add_argument("--decoded-cache", type=int, default=0, metavar="N",
                    help="train: also measure spdld with the job's decoded-sample cache, cache.decoded.max_side N "
                         "(0: not); the figure covers all --epochs, the first of which fills the cache")
    ap.add_argument("--data-dir", help="dataset location (default ~/.cache/spdld-bench/data-...)")
    ap.add_argument("--spdl", choices=["auto", "off"], default="auto",
                    help="auto: measure SPDL if importable or pip-installable into ~/.cache/spdld-bench/pydeps")
    ap.add_argument("--no-perf", action="store_true", help="skip the perf profile of the daemon")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one run may take")
    ap.add_argument("--pss-interval", type=float, default=0.1, help="shortest PSS sampling period, s")
    ap.add_argument("--keep-logs", action="store_true", help="keep the work directory (logs, sockets)")
    ap.add_argument("--from-json", metavar="RESULTS_JSON",
                    help="measure nothing: rewrite RESULTS.md and results.png in --out from a results.json")
    a = ap.parse_args()

    large = a.dataset == "large"
    a.classes = a.classes or (2 if a.quick and large else 3 if large else 4 if a.quick else 10)
    a.per_class = a.per_class or (6 if a.quick and large else 10 if large else 80 if a.quick else 200)
    if large:
        a.min_side = a.min_side if a.min_side != 250 else 1500
        a.max_side = a.max_side if a.max_side != 650 else 4000
        a.quality = a.quality if a.quality != 96 else 90
    a.repeats = a.repeats or (1 if a.quick else 3)
    a.workers = [int(x) for x in a.workers.split(",") if x]
    a.ranks = [int(x) for x in a.ranks.split(",") if x]
    a.identical = [int(x) for x in a.identical.split(",") if x]
    a.build_dir = os.path.abspath(a.build_dir)
    a.out = os.path.abspath(a.out or (os.path.join(HERE, "out") if a.quick else HERE))
    a.job_config = os.path.abspath(a.job_config or {
        "randaug": os.path.join(REPO, "config", "examples", "imagenet_train_randaug.yaml"),
        "train": os.path.join(HERE, "jobs", "train.yaml"),
    }.get(a.recipe, os.path.join(REPO, "config", "examples", "imagenet.yaml")))
    if a.recipe == "randaug":
        a.spdl = "off"  # SPDL's example pipeline has no such recipe
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "spdld-bench")

    if a.from_json:
        from spdld_bench import report
        with open(a.from_json) as f:
            data = json.load(f)
        data["options"].setdefault("prefetch", job_prefetch(a.job_config))
        write_outputs(a.out, data, report)
        log(f"wrote {a.out}/RESULTS.md and results.png from {a.from_json}")
        return 0

    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
        import matplotlib  # noqa: F401
    except ImportError as e:
        print(f"run.py: {e}; run it with /usr/bin/python3 (Debian's, which has torch, torchvision and "
              "matplotlib)", file=sys.stderr)
        return 2
    for b in ("spdld", "spdl-client", "spdl-make-dataset"):
        if not os.access(os.path.join(a.build_dir, "bin", b), os.X_OK):
            print(f"run.py: {a.build_dir}/bin/{b} is missing; build it first, e.g.\n  cmake -S {REPO} -B {a.build_dir} "
                  f"-G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C {a.build_dir} spdld spdl-client spdl-make-dataset "
                  "spdl_python", file=sys.stderr)
            return 2

    from spdld_bench import dataset, envinfo, report, scenarios

    build_type = envinfo.versions(a.build_dir, REPO).get("spdld build type", "?")
    if build_type not in ("Release", "RelWithDebInfo", "?"):
        log(f"warning: {a.build_dir} is a {build_type} build: spdld's figures will not mean much")

    t_begin = time.monotonic()
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_before = envinfo.loadavg()
    python = sys.executable
    os.makedirs(a.out, exist_ok=True)
    ds_args = (f"--classes {a.classes} --per-class {a.per_class} --seed {a.seed} --min-side {a.min_side} "
               f"--max-side {a.max_side} --quality {a.quality}")
    data_root = os.path.abspath(a.data_dir or os.path.join(
        cache, f"{'large' if large else 'data'}-c{a.classes}-n{a.per_class}-s{a.seed}-{a.min_side}-{a.max_side}"
               f"-q{a.quality}"))
    if large:
        desc = dataset.make_large(data_root, a.classes, a.per_class, a.seed, a.min_side, a.max_side, a.quality,
                                  log=log)
        ds_args = f"(tests/python/photos.py) " + ds_args
    else:
        desc = dataset.make(os.path.join(a.build_dir, "bin", "spdl-make-dataset"), data_root, a.classes,
                            a.per_class, a.seed, a.min_side, a.max_side, a.quality, log=log)
    log(f"dataset: {desc['count']} files, mean {desc['mean_width']:.0f}x{desc['mean_height']:.0f}, "
        f"{desc['mean_bytes'] / 1e3:.0f} kB")

    have_py, py_status = find_python_client(python, a.build_dir)
    log(f"Python client: {py_status}")
    spdl_path, spdl_status = (None, "skipped (--spdl off)")
    if a.spdl == "auto":
        spdl_path, spdl_status = find_spdl(python, os.path.join(cache, "pydeps"), True)
    if a.recipe == "train" and spdl_path:
        spdl_status = spdl_status.replace(
            "(scale the shorter side to 256, bilinear, crop 224, rgb24;",
            "(crop a window drawn by torchvision's RandomResizedCrop rule, scale it to 224x224, bilinear, hflip "
            "with p 0.5, rgb24;")
    log(f"SPDL: {spdl_status}")

    a.shards_pattern, shards_status = None, None
    if a.recipe == "train" and a.shard_max_side:
        shard_dir = data_root + f"-shards-max{a.shard_max_side}"
        try:
            a.shards_pattern, _ = dataset.make_shards(python, os.path.join(REPO, "tools", "spdl_shard.py"), data_root,
                                                      shard_dir, a.shard_max_side, log=log)
            shards_status = (f"`spdl-shard --folder DATA {shard_dir} --max-side {a.shard_max_side}`: "
                             f"{dataset.shard_bytes(shard_dir) / 1e6:.1f} MB of shards "
                             f"(the JPEG files: {desc['total_bytes'] / 1e6:.1f} MB)")
        except (OSError, subprocess.CalledProcessError, ValueError, KeyError) as e:
            shards_status = f"not measured: spdl-shard failed ({e})"
        log(f"shards: {shards_status}")

    workdir = tempfile.mkdtemp(prefix="spdld-bench-")
    env = scenarios.Env(python=python, build_dir=a.build_dir, job_config=a.job_config, data_root=data_root,
                        dataset_count=desc["count"], epochs=a.epochs, batch=32, seed=42, workdir=workdir,
                        timeout=a.timeout, pss_interval=a.pss_interval, spdl_pythonpath=spdl_path or "", log=log,
                        recipe=a.recipe,
                        job_configs={"full": os.path.join(HERE, "jobs", "full_decode.yaml"),
                                     "shards": os.path.join(HERE, "jobs", "train_shards.yaml")})
    configs = build_configs(a, have_py, spdl_path is not None, a.shards_pattern is not None)
    results = {c.key: {"config": dataclasses.asdict(c), "runs": [], "errors": []} for c in configs}
    total = len(configs) * a.repeats
    n = 0
    interrupted = False
    try:
        for rep in range(a.repeats):
            for c in configs:
                n += 1
                try:
                    r = scenarios.measure(env, c, rep)
                except Exception as e:  # one failed run must not lose the others
                    results[c.key]["errors"].append(f"repeat {rep + 1}: {e}")
                    log(f"[{n}/{total}] {c.label}, {c.ranks} rank(s): FAILED: {str(e).splitlines()[0]}")
                    continue
                results[c.key]["runs"].append(r)
                log(f"[{n}/{total}] {c.label}, {c.ranks} rank(s), rep {rep + 1}: {r['samples_per_s']:.0f} "
                    f"samples/s, {r['cpu_ms_per_sample']:.2f} ms CPU/sample, peak PSS {r['peak_pss_mib']:.0f} MiB, "
                    f"first batch {r['first_batch_s']:.3f} s, other load {r['foreign_cores']:.2f} cores")
    except KeyboardInterrupt:  # write what there is (the run in flight cleaned up after itself)
        interrupted = True
        log("interrupted: writing the report from the runs done so far")

    profile = None
    if not a.no_perf and not interrupted:
        perf = shutil.which("perf")
        if not perf:
            profile = {"error": "perf is not installed"}
        else:
            log("profiling the daemon with perf (not timed)")
            try:
                sym, dso = scenarios.profile_daemon(env, a.threads, perf)
                profile = {"sym": sym, "dso": dso}
            except Exception as e:
                profile = {"error": str(e).splitlines()[0] if str(e) else repr(e)}

    load_after = envinfo.loadavg()
    data = {
        "command": " ".join(shlex.quote(x) for x in [python] + sys.argv),
        "started": started,
        "elapsed_s": time.monotonic() - t_begin,
        "load_before": load_before,
        "load_after": load_after,
        "machine": envinfo.machine(),
        "versions": envinfo.versions(a.build_dir, REPO),
        "dataset": desc,
        "interrupted": interrupted,
        "options": {"prefetch": job_prefetch(a.job_config), "quick": a.quick, "repeats": a.repeats, "epochs": a.epochs, "batch": 32, "threads": a.threads,
                    "workers": a.workers, "ranks": a.ranks, "dataset_args": ds_args,
                    "job_config": os.path.relpath(a.job_config, REPO), "pss_interval": a.pss_interval,
                    "recipe": a.recipe, "dataset": a.dataset, "shard_max_side": a.shard_max_side,
                    "shards_status": shards_status},
        "python_client": {"available": have_py, "status": py_status},
        "spdl": {"available": spdl_path is not None, "status": spdl_status},
        "configs": results,
        "profile": profile,
    }
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(data, f, indent=1)
    write_outputs(a.out, data, report)
    failed = sum(len(v["errors"]) for v in results.values())
    log(f"wrote {a.out}/RESULTS.md, results.png, results.json in {(time.monotonic() - t_begin) / 60:.1f} min"
        + (f"; {failed} run(s) FAILED, logs kept in {workdir}" if failed else ""))
    if not failed and not a.keep_logs:
        shutil.rmtree(workdir, ignore_errors=True)
    elif a.keep_logs:
        log(f"logs kept in {workdir}")
    return 1 if failed or interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
