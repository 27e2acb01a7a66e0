#!/usr/bin/python3
"""Per-operation single-thread figures: spdld's media functions (spdl-ops-bench, C++) against
PIL + torchvision (what a DataLoader worker runs) and torchvision's tensor path, on the same
ImageNet-sized JPEGs held in memory; plus spdld alone on audio and video clips. spdld's image
operations run on both paths: exact (the default: PIL's pixels) and fast (decode.resample: fast).

  /usr/bin/python3 bench/ops/run_ops.py --build-dir build-ops            # ~5 min on 2 busy cores
  /usr/bin/python3 bench/ops/run_ops.py --build-dir build-ops --quick    # ~1 min smoke run
  /usr/bin/python3 bench/ops/run_ops.py --build-dir build-ops --photos 40  # + photograph-like JPEGs
                                                                         # in 4:2:0, 4:2:2, 4:4:4, gray

Needs BUILD/bin/spdl-ops-bench and BUILD/bin/spdl-make-dataset (build them Release:
`cmake -S . -B build-ops -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build-ops spdl-ops-bench
spdl-make-dataset`), the ffmpeg command line, and torch + torchvision + PIL in this Python.
Writes bench/ops_results.json and the "Per-operation" section of bench/RESULTS.md (between its
markers; everything else in that file is left as it is).

Every figure is items per CPU-second of one thread (process CPU time, so other load on a shared
machine does not inflate it), the median of --repeats timed passes over all files after one
warm-up pass. Python peers run with torch.set_num_threads(1).
"""
import argparse
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
REPO = os.path.dirname(BENCH)
BEGIN = "<!-- spdl-ops-bench:begin -->"
END = "<!-- spdl-ops-bench:end -->"

IMAGE_OPS = [
    "decode",
    "decode+resize256",
    "decode+resize256+crop224",
    "decode+random_resized_crop224",
    "decode+random_resized_crop224+flip",
    "decode+random_resized_crop224+flip+normalize_f32",
]
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def ffmpeg(args):
    subprocess.run(["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y"] + args, check=True)


def make_images(build, root, count):
    per_class = max(count // 4, 1)
    marker = os.path.join(root, f"done-{per_class}")
    if not os.path.exists(marker):
        log(f"images: writing {4 * per_class} JPEGs to {root}")
        subprocess.run([os.path.join(build, "bin", "spdl-make-dataset"), root, "--classes", "4", "--per-class",
                        str(per_class), "--seed", "7", "--min-side", "250", "--max-side", "650", "--quality", "96"],
                       check=True, stdout=subprocess.DEVNULL)
        open(marker, "w").close()
    out = []
    for c in sorted(os.listdir(root)):
        d = os.path.join(root, c)
        if os.path.isdir(d):
            out += [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".jpg")]
    return out


def make_photos(root, per_layout):
    """Photograph-like JPEGs (tests/python/photos.py) in 4:2:0, 4:2:2, 4:4:4 and grayscale, ImageNet-sized."""
    sys.path.insert(0, os.path.join(REPO, "tests", "python"))
    import numpy as np
    from photos import LAYOUTS, make_photo, save_photo

    marker = os.path.join(root, f"done-{per_layout}")
    os.makedirs(root, exist_ok=True)
    out = {layout: [os.path.join(root, f"{layout}_{i:03d}.jpg") for i in range(per_layout)] for layout in LAYOUTS}
    if not os.path.exists(marker):
        log(f"photos: writing {len(LAYOUTS) * per_layout} JPEGs to {root}")
        rng = np.random.default_rng(26)
        for i in range(per_layout):
            w = int(rng.integers(300, 640))
            h = int(min(max(w * rng.uniform(0.6, 1.4), 250), 640))
            img = make_photo(rng, w, h)
            for layout in LAYOUTS:
                save_photo(img, out[layout][i], layout)
        open(marker, "w").close()
    return out


AUDIO_FORMATS = {  # name: (extension, encoder arguments)
    "WAV (pcm_s16le 44.1 kHz stereo)": ("wav", ["-c:a", "pcm_s16le"]),
    "FLAC (44.1 kHz stereo)": ("flac", ["-c:a", "flac"]),
    "MP3 (128 kb/s, 44.1 kHz stereo)": ("mp3", ["-c:a", "libmp3lame", "-b:a", "128k"]),
    "Opus (96 kb/s, 48 kHz stereo)": ("opus", ["-c:a", "libopus", "-b:a", "96k", "-ar", "48000"]),
}


def make_audio(root, count, seconds):
    os.makedirs(root, exist_ok=True)
    files = {}
    for name, (ext, enc) in AUDIO_FORMATS.items():
        files[name] = []
        for i in range(count):
            p = os.path.join(root, f"a{i:02d}-{seconds}s.{ext}")
            if not os.path.exists(p):
                f = 220 + 37 * i
                src = (f"aevalsrc=0.3*sin(2*PI*{f}*t)+0.1*sin(2*PI*{3 * f}*t)|0.3*sin(2*PI*{f * 1.5}*t):"
                       f"s=44100:d={seconds}")
                ffmpeg(["-f", "lavfi", "-i", src, "-f", "lavfi", "-i", f"anoisesrc=a=0.05:d={seconds}:r=44100",
                        "-filter_complex", "[1]pan=stereo|c0=c0|c1=c0[n];[0][n]amix=inputs=2:normalize=0"]
                       + enc + [p])
            files[name].append(p)
    return files


VIDEO_FORMATS = {
    "H.264 MP4 640x360 30 fps, keyframe every 2 s": ("mp4", ["-c:v", "libx264", "-preset", "veryfast", "-crf", "23",
                                                            "-g", "60", "-pix_fmt", "yuv420p"]),
    "VP9 WebM 640x360 30 fps, keyframe every 2 s": ("webm", ["-c:v", "libvpx-vp9", "-deadline", "realtime",
                                                            "-cpu-used", "8", "-crf", "32", "-b:v", "0", "-g", "60",
                                                            "-pix_fmt", "yuv420p"]),
}


def make_video(root, count, seconds):
    os.makedirs(root, exist_ok=True)
    files = {}
    for name, (ext, enc) in VIDEO_FORMATS.items():
        files[name] = []
        for i in range(count):
            p = os.path.join(root, f"v{i:02d}-{seconds}s.{ext}")
            if not os.path.exists(p):
                ffmpeg(["-f", "lavfi", "-i", f"testsrc2=s=640x360:r=30:d={seconds}"] + enc + [p])
            files[name].append(p)
    return files


def run_spdld(build, kind, files, repeats, extra=()):
    cmd = [os.path.join(build, "bin", "spdl-ops-bench"), kind, "--repeats", str(repeats), *extra, *files]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ...: exit {p.returncode}: {p.stderr.strip()[-500:]}")
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def python_peers(files, repeats):
    """PIL + torchvision transforms on PIL images (a DataLoader worker's path) and torchvision's
    tensor path (torchvision.io.decode_jpeg + tensor transforms, antialias=True)."""
    import torch
    import torchvision
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    from PIL import Image

    torch.set_num_threads(1)
    torch.manual_seed(0)
    blobs = []
    for p in files:
        with open(p, "rb") as f:
            blobs.append(f.read())
    to_tensor, normalize = T.ToTensor(), T.Normalize(MEAN, STD)
    rrc_pil, flip = T.RandomResizedCrop(224), T.RandomHorizontalFlip()
    rrc_t = T.RandomResizedCrop(224, antialias=True)

    def pil_decode(b):
        return Image.open(io.BytesIO(b)).convert("RGB")

    pil = {
        "decode": lambda b: pil_decode(b),
        "decode+resize256": lambda b: F.resize(pil_decode(b), 256),
        "decode+resize256+crop224": lambda b: F.center_crop(F.resize(pil_decode(b), 256), 224),
        "decode+random_resized_crop224": lambda b: rrc_pil(pil_decode(b)),
        "decode+random_resized_crop224+flip": lambda b: flip(rrc_pil(pil_decode(b))),
        "decode+random_resized_crop224+flip+normalize_f32": lambda b: normalize(to_tensor(flip(rrc_pil(pil_decode(b))))),
    }

    def tv_decode(b):
        # RGB like PIL's convert("RGB") (a gray JPEG gives three channels, as a DataLoader's would).
        return torchvision.io.decode_jpeg(torch.frombuffer(bytearray(b), dtype=torch.uint8),
                                          mode=torchvision.io.ImageReadMode.RGB)

    tv = {
        "decode": lambda b: tv_decode(b),
        "decode+resize256": lambda b: F.resize(tv_decode(b), 256, antialias=True),
        "decode+resize256+crop224": lambda b: F.center_crop(F.resize(tv_decode(b), 256, antialias=True), 224),
        "decode+random_resized_crop224": lambda b: rrc_t(tv_decode(b)),
        "decode+random_resized_crop224+flip": lambda b: flip(rrc_t(tv_decode(b))),
        "decode+random_resized_crop224+flip+normalize_f32":
            lambda b: F.normalize(flip(rrc_t(tv_decode(b))).float().div_(255), MEAN, STD),
    }
    out = {}
    versions = {"torch": torch.__version__, "torchvision": torchvision.__version__,
                "PIL": __import__("PIL").__version__}
    for peer, table in (("PIL + torchvision", pil), ("torchvision tensors", tv)):
        for op in IMAGE_OPS:
            fn = table[op]
            try:
                for b in blobs:
                    fn(b)  # warm-up
                cpu = []
                for _ in range(repeats):
                    c0 = time.process_time()
                    for b in blobs:
                        fn(b)
                    cpu.append(time.process_time() - c0)
                out[(peer, op)] = {"cpu_s": cpu, "items": len(blobs)}
            except Exception as e:  # a peer that cannot do an op is reported, not fatal
                out[(peer, op)] = {"error": f"{type(e).__name__}: {e}"}
    return out, versions


def rate(entry):
    return statistics.median(entry["units"] / c for c in entry["cpu_s"]) if "cpu_s" in entry else None


def fmt(x):
    return "—" if x is None else (f"{x:,.0f}" if x >= 100 else f"{x:,.1f}")


def write_section(results):
    r = results
    lines = [BEGIN, "## Per-operation single-thread figures (spdl-ops-bench)", "",
             f"Generated by `/usr/bin/python3 bench/ops/run_ops.py` on {r['when']} in {r['minutes']:.1f} min; raw "
             "figures in `bench/ops_results.json`. Every figure is items per **CPU-second of one thread** (process "
             f"CPU time), the median of {r['repeats']} timed passes over all files held in memory, after a warm-up "
             f"pass. Load average before/after: {r['load_before']} / {r['load_after']} on {r['cpus']} CPUs "
             "(CPU time is used because wall time on this shared machine mostly measures the other load). "
             f"Versions: {r['versions']}.", ""]
    for key, entry in r["image_sets"].items():
        lines += [f"### Images: {entry['desc']}", "",
                  "| operation | spdld exact (images/s) | spdld fast | PIL + torchvision | torchvision tensors | "
                  "exact / PIL | exact / fast |",
                  "|---|---|---|---|---|---|---|"]
        for op in IMAGE_OPS:
            row = entry["rates"].get(op, {})
            s, f = row.get("spdld exact"), row.get("spdld fast")
            p, t = row.get("PIL + torchvision"), row.get("torchvision tensors")
            ratio = f"{s / p:.2f}×" if s and p else "—"
            cost = f"{s / f:.2f}×" if s and f else "—"
            lines.append(f"| {op} | {fmt(s)} | {fmt(f)} | {fmt(p)} | {fmt(t)} | {ratio} | {cost} |")
        lines.append("")
    lines += [
              "- spdld exact (the default, `decode.resample: exact`): `ImageDecoder::DecodeInto` — header read, "
              "libjpeg-turbo full-size decode to RGB with its defaults (as PIL), PIL's separable resampling of only "
              "the kept window (media/resample.h), then the output pass for flip / normalize / CHW; the pixels "
              "equal PIL + torchvision's (tests/python/test_parity.py).",
              "- spdld fast (`decode.resample: fast`): the same, but libjpeg-turbo to Y/Cb/Cr planes with DCT-domain "
              "scaling when the target is at most half the source, one swscale pass for colour conversion + "
              "crop + resize. Both write into a reused buffer. "
              "`decode` is a full-size decode to RGB (no transform). Random crops are drawn from "
              "(seed, epoch, index) as in a job.",
              "- PIL + torchvision: `Image.open(BytesIO).convert('RGB')`, then torchvision 0.14's transforms on "
              "the PIL image (`Resize(256)` bilinear with PIL's antialiasing, `CenterCrop(224)`, "
              "`RandomResizedCrop(224)`, `RandomHorizontalFlip()`, `ToTensor()` + `Normalize`); the uint8 ops "
              "end with a PIL image (no tensor conversion), which flatters PIL slightly.",
              "- torchvision tensors: `torchvision.io.decode_jpeg` (libjpeg-turbo, full size), tensor transforms "
              "with `antialias=True`, `float()/255` + `normalize`.",
              "- The fast path's filters differ from PIL's (swscale bilinear on DCT-scaled Y/Cb/Cr planes): its "
              "pixels are close, not equal (README, \"Pixels equal to PIL's\")."]
    if r.get("errors"):
        lines += ["", "Errors: " + "; ".join(r["errors"])]
    if r.get("audio"):
        lines += ["", f"### Audio (spdld only): {r['audio_desc']}", "",
                  "| source | operation | seconds of audio per CPU-second | clips per CPU-second |", "|---|---|---|---|"]
        for a in r["audio"]:
            lines.append(f"| {a['format']} | {a['op']} | {fmt(a['rate'])} | {fmt(a['clips_per_s'])} |")
        lines += ["", "- `AudioDecoder::DecodeInto` from memory: demux, decode, libswresample to 16 kHz mono float32. "
                  "The whole-file row decodes everything; the random-crop row decodes only what the 1 s crop "
                  "needs (seeking when it starts after 1 s), which is what a training job does."]
    if r.get("video"):
        lines += ["", f"### Video (spdld only): {r['video_desc']}", "",
                  "| source | operation | clips per CPU-second |", "|---|---|---|"]
        for v in r["video"]:
            lines.append(f"| {v['format']} | {v['op']} | {fmt(v['rate'])} |")
        lines += ["", "- `VideoDecoder::DecodeInto`: 16 frames at stride 2 (about 1 s) from a random start, each "
                  "resized to 112×112 RGB by swscale into [T, H, W, 3]. With seek: keyframe seek, then decode "
                  "forward; without: decode from the first frame (what a loader that cannot seek pays)."]
    lines.append(END)
    section = "\n".join(lines) + "\n"
    path = os.path.join(BENCH, "RESULTS.md")
    text = open(path).read() if os.path.exists(path) else ""
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section.rstrip("\n") + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(path, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build-ops"))
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/spdld-bench/ops"), help="generated files")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--photos", type=int, default=0,
                    help="also N photograph-like JPEGs per layout (4:2:0, 4:2:2, 4:4:4, gray)")
    ap.add_argument("--no-peers-on-photos", action="store_true", help="PIL / torchvision on the synthetic set only")
    ap.add_argument("--quick", action="store_true", help="fewer files and repeats")
    ap.add_argument("--no-audio", action="store_true")
    ap.add_argument("--no-video", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.repeats, a.images = 2, 80
    t0 = time.time()
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    results = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "repeats": a.repeats,
               "cpus": os.cpu_count(), "load_before": load_before, "errors": [], "raw": {}}

    from PIL import Image

    sets = {"synthetic": make_images(a.build_dir, os.path.join(a.work, "images"), a.images)}
    if a.photos:
        for layout, files in make_photos(os.path.join(a.work, "photos"), a.photos).items():
            sets[f"photos {layout}"] = files
    results["image_sets"] = {}
    versions = {}
    for key, images in sets.items():
        sizes = [Image.open(p).size for p in images]
        desc = (f"{len(images)} ImageNet-sized JPEGs, mean {statistics.mean(s[0] for s in sizes):.0f}×"
                f"{statistics.mean(s[1] for s in sizes):.0f}, "
                f"{statistics.mean(os.path.getsize(p) for p in images) / 1000:.0f} kB")
        if key == "synthetic":
            desc += " (`spdl-make-dataset --min-side 250 --max-side 650 --quality 96`: smooth pattern + noise, 4:2:0)"
        else:
            desc += f" (photograph-like content, tests/python/photos.py, PIL quality 90, {key.split()[1]})"
        entry = {"desc": desc, "rates": {}}
        log(f"images [{key}]: spdld (exact and fast) on {len(images)} files")
        raw_spdld = run_spdld(a.build_dir, "image", images, a.repeats, ["--resample", "both"])
        results["raw"][f"spdld_image {key}"] = raw_spdld
        for e in raw_spdld:
            entry["rates"].setdefault(e["op"], {})[f"spdld {e.get('resample', 'exact')}"] = rate(e)
        if key == "synthetic" or not a.no_peers_on_photos:
            log(f"images [{key}]: PIL + torchvision, torchvision tensors")
            peers, versions = python_peers(images, a.repeats)
            results["raw"][f"peers_image {key}"] = {f"{k[0]}|{k[1]}": v for k, v in peers.items()}
            for (peer, op), e in peers.items():
                if "error" in e:
                    results["errors"].append(f"{peer} {op}: {e['error']}")
                    continue
                entry["rates"].setdefault(op, {})[peer] = statistics.median(e["items"] / c for c in e["cpu_s"])
        results["image_sets"][key] = entry
    ffv = subprocess.run(["ffmpeg", "-version"], capture_output=True, text=True).stdout.split("\n")[0].split(" ")[2]
    results["versions"] = (f"python {platform.python_version()}, torch {versions['torch']}, torchvision "
                           f"{versions['torchvision']}, PIL {versions['PIL']}, FFmpeg {ffv}")

    if not a.no_audio:
        n, secs = (3, 10) if a.quick else (10, 10)
        results["audio_desc"] = f"{n} files of {secs} s per format (tones + noise), 1 s random crops, 16 kHz mono"
        results["audio"] = []
        for name, files in make_audio(os.path.join(a.work, "audio"), n, secs).items():
            log(f"audio: {name}")
            for e in run_spdld(a.build_dir, "audio", files, a.repeats, ["--rate", "16000", "--seconds", "1"]):
                results["raw"].setdefault("spdld_audio", []).append(dict(e, format=name))
                clips = statistics.median(e["items"] / c for c in e["cpu_s"])
                results["audio"].append({"format": name, "op": e["op"], "rate": rate(e), "clips_per_s": clips})
    if not a.no_video:
        n, secs = (2, 6) if a.quick else (6, 10)
        results["video_desc"] = f"{n} files of {secs} s per format (testsrc2), 16-frame clips at 112×112"
        results["video"] = []
        for name, files in make_video(os.path.join(a.work, "video"), n, secs).items():
            log(f"video: {name}")
            for e in run_spdld(a.build_dir, "video", files, a.repeats, ["--frames", "16", "--stride", "2",
                                                                        "--size", "112"]):
                results["raw"].setdefault("spdld_video", []).append(dict(e, format=name))
                results["video"].append({"format": name, "op": e["op"], "rate": rate(e)})

    # Sections not measured this time keep the previous run's figures (said so in the table's title).
    previous_path = os.path.join(BENCH, "ops_results.json")
    if (a.no_audio or a.no_video) and os.path.exists(previous_path):
        previous = json.load(open(previous_path))
        for kind, skipped in (("audio", a.no_audio), ("video", a.no_video)):
            if skipped and previous.get(kind):
                results[kind] = previous[kind]
                desc = previous[f"{kind}_desc"].split(" [figures of the run of ")[0]
                results[f"{kind}_desc"] = f"{desc} [figures of the run of {previous.get(f'{kind}_when', previous['when'])}]"
                results[f"{kind}_when"] = previous.get(f"{kind}_when", previous["when"])

    results["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    results["minutes"] = (time.time() - t0) / 60
    with open(os.path.join(BENCH, "ops_results.json"), "w") as f:
        json.dump(results, f, indent=1)
    write_section(results)
    log(f"wrote bench/ops_results.json and the per-operation section of bench/RESULTS.md "
        f"({results['minutes']:.1f} min)")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
