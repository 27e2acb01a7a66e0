"""What the benchmark ran on: the machine, its load, and the versions of everything measured."""
import os
import platform
import subprocess


def _run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def machine():
    model, threads_per_core = "?", None
    siblings = cores = None
    with open("/proc/cpuinfo") as f:
        for line in f:
            k, _, v = line.partition(":")
            k, v = k.strip(), v.strip()
            if k == "model name" and model == "?":
                model = v
            elif k == "siblings" and siblings is None:
                siblings = int(v)
            elif k == "cpu cores" and cores is None:
                cores = int(v)
    if siblings and cores:
        threads_per_core = siblings // cores
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "threads_per_core": threads_per_core,
        "mem_total_gib": mem_kib / (1 << 20),
        "kernel": platform.release(),
        "hostname": platform.node(),
    }


def versions(build_dir, repo):
    import numpy
    import PIL
    import torch
    import torchvision
    from PIL import features

    v = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "PIL": PIL.__version__,
        "PIL libjpeg-turbo": features.version("libjpeg_turbo") if features.check_feature("libjpeg_turbo") else "no",
        "numpy": numpy.__version__,
    }
    # what spdld links: its libjpeg-turbo and swscale, by package version where dpkg knows them
    libs = {}
    for line in _run(["ldd", os.path.join(build_dir, "bin", "spdld")]).splitlines():
        name = line.split("=>")[0].strip()
        if name.startswith(("libturbojpeg", "libjpeg", "libswscale", "libavutil")):
            path = line.split("=>")[1].split("(")[0].strip() if "=>" in line else ""
            pkg = _run(["dpkg", "-S", os.path.realpath(path)]).split(":")[0] if path else ""
            ver = _run(["dpkg-query", "-W", "-f", "${Version}", pkg]) if pkg else ""
            libs[name] = ver or os.path.basename(os.path.realpath(path))
    v["spdld libs"] = ", ".join(f"{k} {x}" for k, x in sorted(libs.items())) or "?"
    rev = _run(["git", "-C", repo, "describe", "--always", "--dirty"])
    v["spdld revision"] = rev or "?"
    cache = os.path.join(build_dir, "CMakeCache.txt")
    if os.path.exists(cache):
        with open(cache) as f:
            for line in f:
                if line.startswith("CMAKE_BUILD_TYPE:"):
                    v["spdld build type"] = line.split("=", 1)[1].strip() or "(none)"
    return v
