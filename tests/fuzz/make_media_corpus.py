#!/usr/bin/python3
"""Writes the seed corpora of tar_fuzz, image_fuzz, audio_fuzz, video_fuzz and http_fuzz.

    /usr/bin/python3 tests/fuzz/make_media_corpus.py [tests/fuzz/corpus]

Needs PIL, numpy, ffmpeg (with libx264, libvpx, libmp3lame, libvorbis, libopus, libwebp), a C
compiler and libjpeg (restart-marker JPEGs; PIL cannot write them). Replaces every file in
corpus/{tar,image,audio,video,http}/ whose name starts with "seed_"; other files there (inputs the
fuzzers found, kept as regressions) are left alone.

Each media seed is a small real file followed by the ops trailer its target reads from the end of
the input (FuzzedDataProvider; see the comment at the top of each target): one trailer that decodes
the file fully, and for images a second with other ops. Everything is a few KB; the whole corpus
stays well under 1 MB.
"""
import io
import os
import random
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
from PIL import Image

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
rng = random.Random(19)


def trailer(values):
    """Bytes that FuzzedDataProvider hands back as `values` ((value, lo, hi) in consumption order)."""
    out = bytearray()
    for v, lo, hi in values:
        span = hi - lo
        d = v - lo
        n = 1 if span < 256 else 2
        chunk = d.to_bytes(n, "big")  # the first byte consumed (the last of the input) is the most significant
        out[:0] = chunk
    return bytes(out)


def clean(sub):
    d = os.path.join(OUT, sub)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if f.startswith("seed_"):
            os.remove(os.path.join(d, f))
    return d


def write(d, name, data):
    with open(os.path.join(d, "seed_" + name), "wb") as f:
        f.write(data)


def picture(w, h, mode="RGB"):
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x ^ y) * 7 % 256], -1).astype(np.uint8)
    a = np.clip(a.astype(int) + np.random.RandomState(w * h).randint(-12, 12, a.shape), 0, 255).astype(np.uint8)
    im = Image.fromarray(a, "RGB")
    if mode == "RGBA":
        alpha = Image.fromarray((x * 255 // max(w - 1, 1)).astype(np.uint8), "L")
        im = im.convert("RGBA")
        im.putalpha(alpha)
    elif mode != "RGB":
        im = im.convert(mode)
    return im


def save(im, fmt, **kw):
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def ffmpeg(args, suffix):
    with tempfile.TemporaryDirectory() as t:
        path = os.path.join(t, "out" + suffix)
        subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-y"] + args + [path], check=True)
        with open(path, "rb") as f:
            return f.read()


RESTART_JPEG_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <jpeglib.h>
int main(int argc, char** argv) {  /* restart_jpeg W H RESTART_ROWS > out.jpg: a gradient */
  int w = atoi(argv[1]), h = atoi(argv[2]);
  struct jpeg_compress_struct c; struct jpeg_error_mgr e;
  c.err = jpeg_std_error(&e); jpeg_create_compress(&c); jpeg_stdio_dest(&c, stdout);
  c.image_width = w; c.image_height = h; c.input_components = 3; c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c); jpeg_set_quality(&c, 80, TRUE); c.restart_in_rows = atoi(argv[3]);
  jpeg_start_compress(&c, TRUE);
  unsigned char* row = malloc(3 * w);
  while (c.next_scanline < c.image_height) {
    for (int x = 0; x < w; ++x) { row[3*x] = x * 4; row[3*x+1] = c.next_scanline * 5; row[3*x+2] = (x ^ c.next_scanline) * 9; }
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c); jpeg_destroy_compress(&c); free(row); return 0;
}
"""


def restart_jpeg(w, h, rows):
    with tempfile.TemporaryDirectory() as t:
        src, exe = os.path.join(t, "r.c"), os.path.join(t, "r")
        with open(src, "w") as f:
            f.write(RESTART_JPEG_C)
        subprocess.run(["cc", "-O1", "-o", exe, src, "-ljpeg"], check=True)
        return subprocess.run([exe, str(w), str(h), str(rows)], check=True, capture_output=True).stdout


def exif_orientation(tag):
    ex = Image.Exif()
    ex[0x0112] = tag
    return ex.tobytes()


# ---- images: (geometry, w, h, shorter, dtype, nchw, gray, exif, composite, dct, rgb_path, interp, flip, normalize,
#      max_pixels, seed) ----
def image_trailer(geometry=0, w=24, h=24, shorter=32, dtype=0, nchw=0, gray=0, exif=0, composite=0, dct=1, rgb=0,
                  interp=0, flip=0, normalize=0, maxpix=3, seed=0):
    return trailer([(geometry, 0, 3), (w, 1, 48), (h, 1, 48), (shorter, 1, 64), (dtype, 0, 3), (nchw, 0, 255),
                    (gray, 0, 255), (exif, 0, 255), (composite, 0, 255), (dct, 0, 255), (rgb, 0, 255), (interp, 0, 2),
                    (flip, 0, 2), (normalize, 0, 255), (maxpix, 0, 3), (seed, 0, 255)])


def random_image_trailer():
    return image_trailer(geometry=rng.randrange(4), w=rng.randint(1, 48), h=rng.randint(1, 48),
                         shorter=rng.randint(1, 64), dtype=rng.randrange(4), nchw=rng.randrange(2),
                         gray=rng.randrange(2), exif=rng.randrange(2), composite=rng.randrange(2), dct=rng.randrange(2),
                         rgb=rng.randrange(2), interp=rng.randrange(3), flip=rng.randrange(3),
                         normalize=rng.randrange(2), maxpix=rng.choice([2, 3]), seed=rng.randrange(256))


def images():
    d = clean("image")
    w, h = 80, 60
    rgb = picture(w, h)
    files = {
        "baseline_420.jpg": save(rgb, "JPEG", quality=75, subsampling=2),
        "baseline_444.jpg": save(rgb, "JPEG", quality=75, subsampling=0),
        "baseline_422.jpg": save(rgb, "JPEG", quality=75, subsampling=1),
        "progressive.jpg": save(rgb, "JPEG", quality=70, progressive=True),
        "gray.jpg": save(rgb.convert("L"), "JPEG", quality=70),
        "cmyk.jpg": save(rgb.convert("CMYK"), "JPEG", quality=70),
        "exif_rot6.jpg": save(rgb, "JPEG", quality=60, exif=exif_orientation(6)),
        "exif_rot3.jpg": save(rgb.resize((33, 17)), "JPEG", quality=60, exif=exif_orientation(3)),
        "restart.jpg": restart_jpeg(w, h, 1),
        "odd_size.jpg": save(picture(37, 23), "JPEG", quality=80, subsampling=2),
        "rgb.png": save(rgb, "PNG"),
        "rgba.png": save(picture(40, 30, "RGBA"), "PNG"),
        "palette.png": save(rgb.convert("P", palette=Image.ADAPTIVE, colors=16), "PNG"),
        "gray.png": save(rgb.convert("L"), "PNG"),
        "gray16.png": save(Image.fromarray((np.arange(40 * 30).reshape(30, 40) * 50).astype(np.uint16)), "PNG"),
        "interlaced.png": ffmpeg(["-f", "lavfi", "-i", "testsrc=size=32x24:rate=1", "-frames:v", "1",
                                  "-pred", "mixed", "-pix_fmt", "rgb24"], ".png"),
        "rgb48.png": ffmpeg(["-f", "lavfi", "-i", "testsrc=size=24x16:rate=1", "-frames:v", "1",
                             "-pix_fmt", "rgb48be"], ".png"),
        "lossy.webp": save(rgb, "WEBP", quality=50),
        "lossless.webp": save(picture(32, 24), "WEBP", lossless=True),
        "alpha.webp": save(picture(32, 24, "RGBA"), "WEBP", quality=50),
        "raw.tiff": save(picture(24, 16), "TIFF"),
        "lzw.tiff": save(rgb, "TIFF", compression="tiff_lzw"),
        "packbits_gray.tiff": save(rgb.convert("L"), "TIFF", compression="packbits"),
        "static.gif": save(rgb.convert("P", palette=Image.ADAPTIVE, colors=32), "GIF"),
        "24.bmp": save(picture(30, 20), "BMP"),
        "8.bmp": save(picture(30, 20).convert("P", palette=Image.ADAPTIVE, colors=16), "BMP"),
        "32.bmp": ffmpeg(["-f", "lavfi", "-i", "testsrc=size=20x12:rate=1", "-frames:v", "1", "-pix_fmt", "bgra"],
                         ".bmp"),
    }
    frames = [picture(24, 16).convert("P", palette=Image.ADAPTIVE, colors=8),
              picture(24, 16).rotate(90).convert("P", palette=Image.ADAPTIVE, colors=8)]
    b = io.BytesIO()
    frames[0].save(b, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    files["animated.gif"] = b.getvalue()
    for name, data in sorted(files.items()):
        full = image_trailer(geometry=0, w=24, h=20, shorter=24, dct=1, exif=1, composite=1)
        write(d, name + ".v0", data + full)
        write(d, name + ".v1", data + random_image_trailer())
    # A full-size JPEG decode (no DCT scaling, RGB path) and a gray one, from the same file.
    write(d, "baseline_420.jpg.full", files["baseline_420.jpg"] + image_trailer(geometry=1, w=48, h=40, dct=0, rgb=1))
    write(d, "baseline_420.jpg.gray", files["baseline_420.jpg"] + image_trailer(geometry=2, w=16, h=16, gray=1))


# ---- audio: (rate idx, stereo, num_samples, random crop, int16, channels last, seek, max seconds idx, seed) ----
def audio_trailer(rate=1, stereo=0, n=1600, crop=0, int16=0, last=0, seek=1, maxsec=1, seed=0):
    return trailer([(rate, 0, 5), (stereo, 0, 255), (n, 1, 4096), (crop, 0, 255), (int16, 0, 255), (last, 0, 255),
                    (seek, 0, 255), (maxsec, 0, 2), (seed, 0, 255)])


def audios():
    d = clean("audio")
    tone = ["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=8000:duration=0.4"]
    long_tone = ["-f", "lavfi", "-i", "sine=frequency=300:sample_rate=8000:duration=1.6"]
    stereo = ["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=16000:duration=0.3", "-ac", "2"]
    files = {
        "s16.wav": ffmpeg(tone + ["-c:a", "pcm_s16le"], ".wav"),
        "u8_stereo.wav": ffmpeg(stereo + ["-c:a", "pcm_u8"], ".wav"),
        "f32.wav": ffmpeg(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=8000:duration=0.1",
                           "-c:a", "pcm_f32le"], ".wav"),
        "mono.flac": ffmpeg(tone, ".flac"),
        "long.mp3": ffmpeg(long_tone + ["-c:a", "libmp3lame", "-b:a", "8k"], ".mp3"),
        "stereo.mp3": ffmpeg(stereo + ["-c:a", "libmp3lame", "-b:a", "32k"], ".mp3"),
        "vorbis.ogg": ffmpeg(tone + ["-c:a", "libvorbis", "-q:a", "0"], ".ogg"),
        "opus.ogg": ffmpeg(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000:duration=0.3",
                            "-c:a", "libopus", "-b:a", "8k"], ".ogg"),
        "aac.m4a": ffmpeg(tone + ["-c:a", "aac", "-b:a", "16k"], ".m4a"),
    }
    for name, data in sorted(files.items()):
        write(d, name + ".v0", data + audio_trailer())
        write(d, name + ".v1", data + audio_trailer(rate=rng.randrange(6), stereo=rng.randrange(2),
                                                   n=rng.randint(1, 4096), crop=1, int16=rng.randrange(2),
                                                   last=rng.randrange(2), seek=rng.randrange(2), maxsec=2,
                                                   seed=rng.randrange(256)))


# ---- video: (frames, stride, fps idx, random start, start quarters, h, w, interp, seek, small max_pixels, seed) ----
def video_trailer(frames=4, stride=1, fps=0, random_start=0, start=0, h=12, w=16, interp=0, seek=1, small=0, seed=0):
    return trailer([(frames, 1, 4), (stride, 1, 3), (fps, 0, 3), (random_start, 0, 255), (start, 0, 8), (h, 1, 24),
                    (w, 1, 24), (interp, 0, 2), (seek, 0, 255), (small, 0, 255), (seed, 0, 255)])


def videos():
    d = clean("video")
    src = ["-f", "lavfi", "-i", "testsrc=size=32x24:rate=4:duration=2"]
    files = {
        "h264.mp4": ffmpeg(src + ["-c:v", "libx264", "-g", "4", "-pix_fmt", "yuv420p", "-preset", "ultrafast"],
                           ".mp4"),
        "mpeg4.mp4": ffmpeg(src + ["-c:v", "mpeg4", "-g", "4", "-q:v", "20"], ".mp4"),
        "vp8.webm": ffmpeg(src + ["-c:v", "libvpx", "-b:v", "20k", "-g", "4"], ".webm"),
        "vp9.webm": ffmpeg(src + ["-c:v", "libvpx-vp9", "-b:v", "20k", "-g", "4"], ".webm"),
        "h264.mkv": ffmpeg(src + ["-c:v", "libx264", "-g", "8", "-preset", "ultrafast", "-pix_fmt", "yuv444p"],
                           ".mkv"),
        "mjpeg.avi": ffmpeg(["-f", "lavfi", "-i", "testsrc=size=16x16:rate=4:duration=1", "-c:v", "mjpeg",
                             "-q:v", "20"], ".avi"),
        "clip.gif": ffmpeg(["-f", "lavfi", "-i", "testsrc=size=16x12:rate=4:duration=1"], ".gif"),
    }
    for name, data in sorted(files.items()):
        write(d, name + ".v0", data + video_trailer())
        write(d, name + ".v1", data + video_trailer(frames=rng.randint(1, 4), stride=rng.randint(1, 3),
                                                   fps=rng.randrange(4), random_start=1, start=rng.randint(0, 8),
                                                   h=rng.randint(1, 24), w=rng.randint(1, 24), interp=rng.randrange(3),
                                                   seek=rng.randrange(2), small=0, seed=rng.randrange(256)))


# ---- tar shards (the input is the shard as it is) ----
def tar_bytes(fmt, members, end_marker=True):
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=fmt) as t:
        for m in members:
            info = tarfile.TarInfo(m[0])
            kind = m[1]
            if kind == "file":
                info.size = len(m[2])
                if len(m) > 3:
                    info.pax_headers = m[3]
                t.addfile(info, io.BytesIO(m[2]))
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            elif kind == "sym":
                info.type = tarfile.SYMTYPE
                info.linkname = m[2]
                t.addfile(info)
            elif kind == "hard":
                info.type = tarfile.LNKTYPE
                info.linkname = m[2]
                t.addfile(info)
    return trim_tar(b.getvalue(), end_marker)


def trim_tar(data, end_marker=True):
    """The archive without the padding to a 10 KiB record: the members, then the end marker (if any)."""
    data = data.rstrip(b"\0")
    data += b"\0" * (-len(data) % 512)
    return data + (b"\0" * 1024 if end_marker else b"")


def tars():
    d = clean("tar")
    jpg = save(picture(8, 8), "JPEG", quality=50)
    png = save(picture(4, 4), "PNG")
    sample = [("a/000001.jpg", "file", jpg), ("a/000001.cls", "file", b"3\n"), ("a/000001.txt", "file", b"a cat"),
              ("a/000002.png", "file", png), ("a/000002.cls", "file", b" 7 "), ("a/000003.json", "file", b"{}"),
              ("a/.hidden.jpg", "file", b"x")]
    write(d, "ustar.tar", tar_bytes(tarfile.USTAR_FORMAT, sample))
    long_dir = "d" * 90 + "/" + "e" * 60
    write(d, "gnu_longname.tar", tar_bytes(tarfile.GNU_FORMAT, [
        (long_dir + "/k.jpg", "file", jpg), (long_dir + "/k.cls", "file", b"1"), ("dir", "dir"),
        ("link.jpg", "sym", "a/000001.jpg"), ("hard.jpg", "hard", long_dir + "/k.jpg")]))
    write(d, "pax.tar", tar_bytes(tarfile.PAX_FORMAT, [
        ("./x/" + "p" * 120 + ".jpg", "file", jpg), ("x/q.webp", "file", b"RIFF", {"comment": "hi"}),
        ("x/q.cls", "file", b"12")]))
    write(d, "ustar_prefix.tar", tar_bytes(tarfile.USTAR_FORMAT, [("u" * 120 + "/v.jpg", "file", jpg)]))
    write(d, "no_end_marker.tar", tar_bytes(tarfile.USTAR_FORMAT, sample[:3], end_marker=False))
    write(d, "bad_label.tar", tar_bytes(tarfile.USTAR_FORMAT, [("b.jpg", "file", jpg), ("b.cls", "file", b"-1")]))
    # A GNU sparse member (type 'S', written by GNU tar from a file with a hole).
    with tempfile.TemporaryDirectory() as t:
        with open(os.path.join(t, "s.jpg"), "wb") as f:
            f.write(b"\xff\xd8\xff")
            f.seek(40000)
            f.write(b"end")
        with open(os.path.join(t, "k.jpg"), "wb") as f:
            f.write(jpg)
        subprocess.run(["tar", "--format=gnu", "-S", "-cf", os.path.join(t, "o.tar"), "-C", t, "s.jpg", "k.jpg"],
                       check=True)
        with open(os.path.join(t, "o.tar"), "rb") as f:
            write(d, "gnu_sparse.tar", trim_tar(f.read()))
        subprocess.run(["tar", "--format=pax", "-S", "-cf", os.path.join(t, "p.tar"), "-C", t, "s.jpg", "k.jpg"],
                       check=True)
        with open(os.path.join(t, "p.tar"), "rb") as f:
            write(d, "pax_sparse.tar", trim_tar(f.read()))


# ---- HTTP responses (the raw bytes, then max_bytes idx, attempts, piece size) ----
def http_trailer(maxb=1, attempts=1, piece=0):
    return trailer([(maxb, 0, 2), (attempts, 1, 2), (piece, 0, 255)])


def https():
    d = clean("http")
    r = {
        "ok_length": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: image/jpeg\r\n\r\nhello",
        "ok_close": b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nbody until the close",
        "ok_chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\n",
        "ok_http10": b"HTTP/1.0 200 OK\r\n\r\nold",
        "over_limit": b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n" + b"z" * 40,
        "length_lies": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",
        "not_found": b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found",
        "forbidden": b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n",
        "gone_no_reason": b"HTTP/1.1 410\r\nContent-Length: 0\r\n\r\n",
        "unavailable_retry": b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 86400\r\nContent-Length: 0\r\n\r\n",
        "throttled_date": b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: Wed, 21 Oct 2037 07:28:00 GMT\r\n\r\n",
        "redirect": b"HTTP/1.1 301 Moved Permanently\r\nLocation: http://10.0.0.1/\r\nContent-Length: 0\r\n\r\n",
        "continue_then_ok": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        "teapot": b"HTTP/1.1 418 I'm a teapot\r\n\r\n",
        "garbage_status": b"HTTP/1.1 2x0 OK\r\n\r\n",
        "no_status": b"hello world\r\n\r\n",
        "folded_header": b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 1\r\n\r\n!",
        "two_lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        "empty": b"",
    }
    for name, data in sorted(r.items()):
        write(d, name, data + http_trailer(maxb=1, attempts=2 if name.startswith("unavailable") else 1,
                                           piece=0 if len(data) % 2 else 7))
    write(d, "ok_length_small_limit", r["ok_length"] + http_trailer(maxb=0, attempts=1, piece=1))


if __name__ == "__main__":
    images()
    audios()
    videos()
    tars()
    https()
    total = 0
    for sub in ("image", "audio", "video", "tar", "http"):
        files = [f for f in os.listdir(os.path.join(OUT, sub)) if f.startswith("seed_")]
        size = sum(os.path.getsize(os.path.join(OUT, sub, f)) for f in files)
        total += size
        print(f"{sub}: {len(files)} seeds, {size} bytes")
    print(f"total {total} bytes")
