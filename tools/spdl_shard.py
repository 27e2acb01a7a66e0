#!/usr/bin/env python3
"""spdl-shard: writes a dataset as WebDataset-layout tar shards that spdld's `tar` source reads.

Inputs: an image folder (root/<class>/<file>, labels = index of the sorted class folder, as
spdld's `image_folder`), a file list ("path[,label]" lines, spdld's list format) or a COCO
instances set (annotations JSON + image folder; each sample's annotations as a `.json` member).
Output: a local directory or an s3:// prefix, holding NAME-000000.tar, NAME-000001.tar, ... and
NAME.manifest.json (per shard: file name, sample count, bytes, sha256; the classes; the options).

Each sample is a group of members sharing a key (WebDataset): KEY.jpg (or .jpeg/.png/.webp),
KEY.cls (the decimal label, when there is one), KEY.json (COCO), KEY.<ext> for each --sidecar.
KEY is the sample's path relative to its root without its extension, with any '.' in the base
name replaced by '_' (a tar reader takes the key up to the first dot); two samples with the same
key are an error.

Deterministic: the same input and options give byte-identical shards and manifest (sample order
fixed by the input, or by --shuffle SEED; tar headers with mtime 0, uid/gid 0, no user names,
mode 0644; pax headers only for names that need them; re-encoding by the same Pillow is
deterministic).

Re-encoding (--max-side N [--quality Q]): images whose longer side exceeds N are scaled down
(Lanczos) so that it is N, and written as JPEG at quality Q (default 90); smaller images are kept
byte for byte unless --quality is given, which re-encodes every image. EXIF is carried. COCO boxes,
polygons and areas are scaled with their image.

s3:// output: each shard is written to a temporary local file, then PUT (on 2 threads, while the
next shards are written; the manifest last) with AWS Signature V4
(x-amz-content-sha256 = the shard's sha256, checked by the store; the ETag checked against the
MD5), retried with backoff on 5xx/429/connection errors. Credentials, endpoint and region are read
as spdld's client reads them: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, else
the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials; profile
AWS_PROFILE or "default"); endpoint AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL (path-style), else
AWS (virtual-hosted); region AWS_REGION, else AWS_DEFAULT_REGION, else us-east-1. Secrets are never
printed.

Needs Python 3.9+; Pillow (python3-pil) only for re-encoding.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import configparser
import csv
import datetime
import hashlib
import hmac
import http.client
import importlib.util
import io
import json
import os
import random
import re
import sys
import tarfile
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")  # those the tar source reads by default
MANIFEST_VERSION = 1
S3_MAX_PUT_BYTES = 5 << 30  # a single PUT's limit (no multipart upload here)
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UPLOAD_THREADS = 2  # s3://: shards uploaded while the next ones are written (at most this many waiting)


class ShardError(Exception):
    """A clear, user-facing error: printed as "spdl-shard: MESSAGE", exit status 1."""


@dataclass
class Sample:
    key: str
    image: Path  # the image file
    label: Optional[int] = None
    annotation: Optional[dict] = None  # COCO: {"image": ..., "annotations": [...]}
    source: str = ""  # for error messages: the path as the input named it


# ---------------------------------------------------------------------------------------------
# Inputs


def make_key(rel: str) -> str:
    """The WebDataset key of a path relative to its root: no extension, no '.' in the base name."""
    rel = rel.replace(os.sep, "/").lstrip("/")
    while rel.startswith("./"):
        rel = rel[2:]
    head, _, base = rel.rpartition("/")
    stem = base[: base.rfind(".")] if base.rfind(".") > 0 else base
    stem = stem.replace(".", "_")
    if not stem:
        raise ShardError(f"{rel}: no usable file name for a key")
    return f"{head}/{stem}" if head else stem


def image_ext(path: Path) -> str:
    return path.suffix.lower().lstrip(".")


def folder_samples(root: Path, extensions: tuple) -> tuple[list, list]:
    """(samples, classes) of root/<class>/<file>, as spdld's image_folder scans it: classes sorted
    bytewise, files of a class (nested folders included) sorted by relative path; hidden names and
    files directly in root ignored."""
    if not root.is_dir():
        raise ShardError(f"{root}: not a directory")
    classes = sorted((d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")), key=os.fsencode)
    samples = []
    for label, cls in enumerate(classes):
        files, seen = [], set()
        for dirpath, dirnames, filenames in os.walk(root / cls, followlinks=True):
            st = os.stat(dirpath)
            if (st.st_dev, st.st_ino) in seen:  # a link loop or two links to one folder: scanned once
                dirnames[:] = []
                continue
            seen.add((st.st_dev, st.st_ino))
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for f in filenames:
                if not f.startswith(".") and f.rsplit(".", 1)[-1].lower() in extensions and "." in f:
                    files.append(os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/"))
        for rel in sorted(files, key=os.fsencode):  # bytewise, as the daemon sorts
            samples.append(Sample(key=make_key(rel), image=root / rel, label=label, source=rel))
    if not samples:
        raise ShardError(f"{root}: no image ({', '.join(extensions)}) in any class folder")
    return samples, classes


def list_samples(list_path: Path, root: Optional[Path]) -> list:
    """The samples of a "path[,label]" list (spdld's format: '#' comments, blank lines, an optional
    "path[,label]" header, CSV quoting); relative paths below `root` (default: the list's folder)."""
    try:
        text = list_path.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise ShardError(f"{list_path}: {e.strerror}") from e
    base = root if root is not None else list_path.parent
    samples, problems, first = [], [], True
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = [f.strip() for f in next(csv.reader([line], skipinitialspace=True))]
        if first and fields and fields[0].lower() == "path" and fields[1:] in ([], ["label"]):
            first = False
            continue
        first = False
        if len(fields) > 2 or not fields[0]:
            problems.append(f"{list_path}:{lineno}: expected path[,label]")
            continue
        label = None
        if len(fields) == 2:
            if not re.fullmatch(r"[0-9]+", fields[1]):
                problems.append(f"{list_path}:{lineno}: label '{fields[1]}' is not an integer >= 0")
                continue
            label = int(fields[1])
        p = Path(fields[0])
        full = p if p.is_absolute() else base / p
        # The key: the path below the root; outside it (absolute, or "../"), the absolute path.
        rel = os.path.relpath(full, base)
        if rel == ".." or rel.startswith(".." + os.sep):
            rel = os.path.abspath(full).lstrip(os.sep)
        samples.append(Sample(key=make_key(rel), image=full, label=label, source=fields[0]))
    if problems:
        raise ShardError(f"{list_path}: {len(problems)} bad lines:\n  " + "\n  ".join(problems[:20]))
    if not samples:
        raise ShardError(f"{list_path}: no sample")
    return samples


def coco_samples(annotations: Path, root: Path) -> tuple[list, list]:
    """(samples, categories) of a COCO instances set: one sample per image in image id order, its
    annotation member {"image": the image record, "annotations": its objects in id order}."""
    try:
        data = json.loads(annotations.read_bytes())
    except (OSError, ValueError) as e:
        raise ShardError(f"{annotations}: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise ShardError(f"{annotations}: not a COCO instances file (no \"images\" list)")
    for n, img in enumerate(data["images"]):
        if not isinstance(img, dict) or not isinstance(img.get("id"), int) or not isinstance(img.get("file_name"), str):
            raise ShardError(f"{annotations}: images[{n}] needs an integer \"id\" and a \"file_name\"")
    for n, a in enumerate(data.get("annotations") or []):
        bbox = a.get("bbox") if isinstance(a, dict) else None
        if not isinstance(a, dict) or bbox is not None and (
                not isinstance(bbox, list) or len(bbox) != 4 or not all(isinstance(v, (int, float)) for v in bbox)):
            raise ShardError(f"{annotations}: annotations[{n}] is not an object with a 4-number \"bbox\"")
    per_image: dict = {}
    for a in sorted(data.get("annotations") or [], key=lambda a: a.get("id", 0)):
        per_image.setdefault(a.get("image_id"), []).append(a)
    samples = []
    for img in sorted(data["images"], key=lambda i: i["id"]):
        rel = img["file_name"]
        samples.append(Sample(key=make_key(rel), image=root / rel, source=rel,
                              annotation={"image": img, "annotations": per_image.get(img["id"], [])}))
    if not samples:
        raise ShardError(f"{annotations}: no image")
    return samples, data.get("categories") or []


# ---------------------------------------------------------------------------------------------
# Re-encoding


def scale_annotation(ann: dict, sx: float, sy: float, width: int, height: int) -> dict:
    out = json.loads(json.dumps(ann))
    out["image"]["width"], out["image"]["height"] = width, height
    for a in out["annotations"]:
        if "bbox" in a:
            x, y, w, h = a["bbox"]
            a["bbox"] = [x * sx, y * sy, w * sx, h * sy]
        if "area" in a:
            a["area"] = a["area"] * sx * sy
        seg = a.get("segmentation")
        if isinstance(seg, list):
            a["segmentation"] = [[v * (sx if i % 2 == 0 else sy) for i, v in enumerate(poly)] for poly in seg]
        elif seg is not None:
            raise ShardError(f"image {ann['image'].get('file_name')}: an RLE segmentation cannot be rescaled "
                             "(write this set without --max-side)")
    return out


def reencode(data: bytes, sample: Sample, max_side: Optional[int], quality: Optional[int]) -> tuple:
    """(bytes, extension, annotation) of the image as it goes into the shard."""
    from PIL import Image  # only needed here

    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except Exception as e:  # Pillow raises many types for bad data
        raise ShardError(f"{sample.source}: cannot decode the image ({e})") from e
    w, h = img.size
    too_big = max_side is not None and max(w, h) > max_side
    if not too_big and quality is None and image_ext(sample.image) in IMAGE_EXTENSIONS:
        return data, image_ext(sample.image), sample.annotation
    exif = img.info.get("exif")
    if img.mode not in ("RGB", "L"):
        img = img.convert("RGBA").convert("RGB") if img.mode in ("P", "LA", "RGBA") else img.convert("RGB")
    ann = sample.annotation
    if too_big:
        s = max_side / max(w, h)
        nw, nh = max(1, round(w * s)), max(1, round(h * s))
        img = img.resize((nw, nh), Image.LANCZOS)
        if ann is not None:
            ann = scale_annotation(ann, nw / w, nh / h, nw, nh)
    out = io.BytesIO()
    kw = {"exif": exif} if exif else {}
    img.save(out, format="JPEG", quality=quality if quality is not None else 90, optimize=False, **kw)
    return out.getvalue(), "jpg", ann


# ---------------------------------------------------------------------------------------------
# S3


def s3_access(environ=os.environ) -> dict:
    """{key_id, secret, token, endpoint, region} as spdld's client reads them (see the module doc)."""
    key_id, secret, token = (environ.get(k, "") for k in
                             ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"))
    if not (key_id and secret):
        path = environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(
            environ.get("HOME") or os.path.expanduser("~"), ".aws", "credentials")
        cp = configparser.ConfigParser(interpolation=None)
        try:
            cp.read(path)
        except configparser.Error:
            pass
        profile = environ.get("AWS_PROFILE") or "default"
        if cp.has_section(profile):
            sec = cp[profile]
            key_id, secret = sec.get("aws_access_key_id", ""), sec.get("aws_secret_access_key", "")
            token = sec.get("aws_session_token", "")
        else:
            key_id = secret = token = ""
    return {"key_id": key_id, "secret": secret, "token": token,
            "endpoint": environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL") or "",
            "region": environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or "us-east-1"}


def _quote(s: str, safe: str = "-_.~") -> str:
    return urllib.parse.quote(s, safe=safe)


def sigv4_headers(method: str, host: str, path: str, query: dict, headers: dict, payload_sha256: str,
                  key_id: str, secret: str, region: str, now: datetime.datetime, token: str = "",
                  service: str = "s3") -> dict:
    """The headers to send (given ones + x-amz-date, x-amz-content-sha256, [x-amz-security-token],
    Authorization) for an AWS Signature V4 request. `path` is already URI-encoded."""
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    h = {k.lower(): str(v).strip() for k, v in headers.items()}
    h["host"] = host
    h["x-amz-date"] = amz_date
    h["x-amz-content-sha256"] = payload_sha256
    if token:
        h["x-amz-security-token"] = token
    names = sorted(h)
    canonical_query = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query.items()))
    canonical = "\n".join([method, path, canonical_query, "".join(f"{n}:{h[n]}\n" for n in names),
                           ";".join(names), payload_sha256])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    k = ("AWS4" + secret).encode()
    for part in (day, region, service, "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    h["authorization"] = (f"AWS4-HMAC-SHA256 Credential={key_id}/{scope}, SignedHeaders={';'.join(names)}, "
                          f"Signature={signature}")
    return h


class S3Writer:
    """PUTs files below s3://bucket/prefix/ (prefix may be empty)."""

    def __init__(self, url: str, max_attempts: int = 5, timeout_s: float = 300) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ShardError(f"{url}: expected s3://bucket/prefix")
        self.bucket, self.prefix = parsed.netloc, parsed.path.strip("/")
        self.access = s3_access()
        self.max_attempts, self.timeout_s = max_attempts, timeout_s
        endpoint = self.access["endpoint"]
        if endpoint:  # path-style on an explicit endpoint
            e = urllib.parse.urlparse(endpoint)
            if e.scheme not in ("http", "https") or not e.netloc:
                raise ShardError(f"endpoint {endpoint}: expected http:// or https://")
            self.scheme, self.host = e.scheme, e.netloc
            self.base_path = e.path.rstrip("/") + "/" + _quote(self.bucket, safe="-_.~")
        else:  # virtual-hosted on AWS
            self.scheme, self.host = "https", f"{self.bucket}.s3.{self.access['region']}.amazonaws.com"
            self.base_path = ""

    def url_of(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.prefix + '/' if self.prefix else ''}{name}"

    def put(self, name: str, path: Path, sha256: str, md5: str, content_type: str) -> None:
        """PUTs the file `path` as NAME below the prefix; checks the ETag against `md5`."""
        size = path.stat().st_size
        if size > S3_MAX_PUT_BYTES:
            raise ShardError(f"PUT {self.url_of(name)}: {size} bytes is more than one PUT may carry (5 GiB); use "
                             "a smaller --shard-bytes or --shard-size")

        def check(resp) -> str:
            resp.read()
            etag = (resp.getheader("ETag") or "").strip('"').lower()
            if len(etag) == 32 and all(c in "0123456789abcdef" for c in etag) and etag != md5:
                return f"ETag {etag} is not the MD5 sent ({md5})"
            return ""

        self._request("PUT", name, check, path, sha256, {"content-length": str(size), "content-type": content_type})

    def get_digest(self, name: str) -> tuple:
        """(bytes, sha256 hex) of the object NAME below the prefix, streamed."""
        out: list = []

        def digest(resp) -> str:
            sha, n = hashlib.sha256(), 0
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                sha.update(chunk)
                n += len(chunk)
            length = resp.getheader("Content-Length")
            if length is not None and int(length) != n:
                return f"got {n} of {length} bytes"
            out[:] = [n, sha.hexdigest()]
            return ""

        self._request("GET", name, digest)
        return out[0], out[1]

    def _request(self, method: str, name: str, on_200: Callable, body_path: Optional[Path] = None,
                 sha256: str = EMPTY_SHA256, headers: Optional[dict] = None) -> None:
        """One request, retried with backoff on 5xx / 429 / connection errors / on_200's complaint
        (on_200(response) -> "" when the answer is good, else what is wrong with it)."""
        key = (self.prefix + "/" if self.prefix else "") + name
        upath = self.base_path + "/" + _quote(key, safe="-_.~/")
        what = f"{method} {self.url_of(name)}"
        delay = 0.2
        for attempt in range(1, self.max_attempts + 1):
            h = dict(headers or {})
            if self.access["key_id"] and self.access["secret"]:
                h = sigv4_headers(method, self.host, upath, {}, h, sha256, self.access["key_id"],
                                  self.access["secret"], self.access["region"],
                                  datetime.datetime.now(datetime.timezone.utc), self.access["token"])
            else:
                h["x-amz-content-sha256"] = sha256
            conn_cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            retry, problem = False, ""
            try:
                conn = conn_cls(self.host, timeout=self.timeout_s)
                try:
                    if body_path is not None:
                        with open(body_path, "rb") as body:
                            conn.request(method, upath, body=body, headers=h)
                            resp = conn.getresponse()
                    else:
                        conn.request(method, upath, headers=h)
                        resp = conn.getresponse()
                    if resp.status == 200:
                        problem = on_200(resp)
                        if not problem:
                            return
                        retry = True
                    else:
                        text = resp.read()
                        code = ""
                        if b"<Code>" in text:
                            code = text.split(b"<Code>", 1)[1].split(b"</Code>", 1)[0].decode(errors="replace")
                        problem = f"HTTP {resp.status} {resp.reason}" + (f" ({code})" if code else "")
                        retry = resp.status >= 500 or resp.status == 429
                finally:
                    conn.close()
            except (OSError, http.client.HTTPException) as e:
                retry, problem = True, f"{type(e).__name__}: {e}"
            if not retry or attempt == self.max_attempts:
                raise ShardError(f"{what}: {problem}" + (f" (after {attempt} attempts)" if attempt > 1 else ""))
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


# ---------------------------------------------------------------------------------------------
# Writing


def parse_bytes(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    num, unit = (t[:-1], t[-1]) if t and t[-1].isalpha() else (t, "")
    try:
        value = int(float(num) * units[unit])
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (e.g. 1000000, 512M, 1G)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}': must be > 0")
    return value


def tar_entry_bytes(name: str, size: int) -> int:
    """Bytes a member takes in a pax tar: its header(s) and its data padded to 512."""
    extra = 0
    try:
        name.encode("ascii")
        ascii_ok = True
    except UnicodeEncodeError:
        ascii_ok = False
    if not ascii_ok or len(name) > 100 and (len(name) > 255 or "/" not in name[-101:]):
        extra = 512 + 512 * ((len(name.encode()) + 40 + 511) // 512)
    return extra + 512 + (size + 511) // 512 * 512


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    tar.addfile(info, io.BytesIO(data))


class Progress:
    """One line on stderr: samples done / total, a bar, shards written, rate. Silent if disabled."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.start, self.last = total, enabled, time.monotonic(), 0.0

    def update(self, done: int, shards: int, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not final and now - self.last < 0.2:
            return
        self.last = now
        frac = done / self.total if self.total else 1.0
        bar = "#" * int(frac * 30)
        rate = done / max(now - self.start, 1e-6)
        sys.stderr.write(f"\r[{bar:<30}] {done}/{self.total} samples, {shards} shards, {rate:.0f}/s")
        if final:
            sys.stderr.write("\n")
        sys.stderr.flush()


def prepare(s: Sample, max_side: Optional[int], quality: Optional[int], sidecars: list) -> list:
    """The members [(name, bytes), ...] of one sample: the image (re-encoded if asked), .cls, .json,
    sidecars. Runs in a worker process with --workers > 1."""
    try:
        data = s.image.read_bytes()
    except OSError as e:
        raise ShardError(f"{s.source}: {e.strerror or e}") from e
    ext, ann = image_ext(s.image), s.annotation
    if max_side is not None or quality is not None:
        data, ext, ann = reencode(data, s, max_side, quality)
    members = [(f"{s.key}.{ext}", data)]
    if s.label is not None:
        members.append((f"{s.key}.cls", str(s.label).encode()))
    if ann is not None:
        members.append((f"{s.key}.json", json.dumps(ann, sort_keys=True, separators=(",", ":")).encode()))
    for side in sidecars:
        p = s.image.with_suffix("." + side) if s.image.suffix else Path(str(s.image) + "." + side)
        if p.is_file():
            try:
                members.append((f"{s.key}.{side}", p.read_bytes()))
            except OSError as e:
                raise ShardError(f"{p}: {e.strerror or e}") from e
    return members


def prepare_all(samples: list, max_side: Optional[int], quality: Optional[int], sidecars: list,
                workers: int) -> Iterator:
    """prepare() of each sample, in order; on `workers` processes (at most workers * 16 samples in
    flight) when workers > 1. The output does not depend on `workers`."""
    if workers <= 1:
        for s in samples:
            yield prepare(s, max_side, quality, sidecars)
        return
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
        window: collections.deque = collections.deque()
        it = iter(samples)
        try:
            for s in it:
                window.append(pool.submit(prepare, s, max_side, quality, sidecars))
                if len(window) >= workers * 16:
                    yield window.popleft().result()
            while window:
                yield window.popleft().result()
        finally:
            for f in window:
                f.cancel()


def write_shards(samples: list, out: str, name: str, shard_size: Optional[int], shard_bytes: Optional[int],
                 max_side: Optional[int], quality: Optional[int], sidecars: list, classes: Optional[list],
                 categories: Optional[list], progress: bool, input_desc: str, workers: int = 1) -> dict:
    """Writes the shards and the manifest; returns the manifest."""
    seen: dict = {}
    for s in samples:
        if s.key in seen:
            raise ShardError(f"two samples have the key '{s.key}': {seen[s.key]} and {s.source} "
                             "(keys are paths without extension)")
        seen[s.key] = s.source
    remote = out.startswith("s3://")
    s3 = S3Writer(out) if remote else None
    out_dir = None
    if not remote:
        out_dir = Path(out)
        out_dir.mkdir(parents=True, exist_ok=True)
    tmpdir = tempfile.TemporaryDirectory(prefix="spdl-shard-") if remote else None
    uploads = concurrent.futures.ThreadPoolExecutor(max_workers=UPLOAD_THREADS) if remote else None
    pending: collections.deque = collections.deque()  # uploads under way, oldest first
    shards: list = []
    bar = Progress(len(samples), progress)

    state: dict = {"tar": None, "file": None, "path": None, "count": 0, "bytes": 1024}

    def open_shard() -> None:
        fname = f"{name}-{len(shards):06d}.tar"
        path = (Path(tmpdir.name) if remote else out_dir) / (fname + ".partial")
        f = open(path, "wb")
        state.update(tar=tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT), file=f, path=path,
                     count=0, bytes=1024, fname=fname)

    def upload(fname: str, path: Path, sha256: str, md5: str) -> None:
        s3.put(fname, path, sha256, md5, "application/x-tar")
        path.unlink()

    def close_shard() -> None:
        end = state["tar"].offset  # after the last member
        state["tar"].close()
        state["file"].truncate(end + 1024)  # the end-of-archive blocks, without tarfile's record padding
        state["file"].close()
        path: Path = state["path"]
        sha, md5 = hashlib.sha256(), hashlib.md5()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                sha.update(chunk)
                md5.update(chunk)
        fname = state["fname"]
        size = path.stat().st_size
        if remote:
            while len(pending) >= UPLOAD_THREADS:  # bounds the temporary files
                pending.popleft().result()
            pending.append(uploads.submit(upload, fname, path, sha.hexdigest(), md5.hexdigest()))
        else:
            path.replace(out_dir / fname)
        shards.append({"file": fname, "samples": state["count"], "bytes": size, "sha256": sha.hexdigest()})
        state["tar"] = None

    prepared = None
    try:
        prepared = prepare_all(samples, max_side, quality, sidecars, workers)
        for i in range(len(samples)):
            members = next(prepared)
            size = sum(tar_entry_bytes(n, len(d)) for n, d in members)
            if state["tar"] is not None and (
                    (shard_size is not None and state["count"] >= shard_size) or
                    (shard_bytes is not None and state["bytes"] + size > shard_bytes)):
                close_shard()
            if state["tar"] is None:
                open_shard()
            for n, d in members:
                add_member(state["tar"], n, d)
            state["count"] += 1
            state["bytes"] += size
            bar.update(i + 1, len(shards))
        close_shard()
        while pending:
            pending.popleft().result()
    except BaseException:
        if prepared is not None:
            prepared.close()  # stops the workers
        if state["tar"] is not None:  # an error mid-shard: leave no partial file behind
            state["tar"].close()
            state["file"].close()
            state["path"].unlink(missing_ok=True)
        if remote:
            uploads.shutdown(wait=True, cancel_futures=True)
            tmpdir.cleanup()
        raise
    manifest = {
        "format": "spdl-shard", "version": MANIFEST_VERSION, "input": input_desc,
        "samples": sum(s["samples"] for s in shards), "shards": shards,
        "pattern": f"{name}-{{000000..{len(shards) - 1:06d}}}.tar",
        "options": {"shard_size": shard_size, "shard_bytes": shard_bytes, "max_side": max_side,
                    "quality": quality, "sidecars": sidecars},
    }
    if classes is not None:
        manifest["classes"] = classes
    if categories is not None:
        manifest["categories"] = categories
    text = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    mname = f"{name}.manifest.json"
    if remote:
        mpath = Path(tmpdir.name) / mname
        mpath.write_bytes(text)
        try:
            s3.put(mname, mpath, hashlib.sha256(text).hexdigest(), hashlib.md5(text).hexdigest(), "application/json")
        finally:
            uploads.shutdown()
            tmpdir.cleanup()
    else:
        tmp = out_dir / (mname + ".partial")
        tmp.write_bytes(text)
        tmp.replace(out_dir / mname)
        written = {sh["file"] for sh in shards}
        stale = sorted(f.name for f in out_dir.iterdir()
                       if re.fullmatch(re.escape(name) + r"-[0-9]{6}\.tar", f.name) and f.name not in written)
        if stale:
            print(f"spdl-shard: warning: {out_dir} also holds {len(stale)} older shards not in this manifest "
                  f"({stale[0]}{' ...' if len(stale) > 1 else ''}); a glob would read them", file=sys.stderr)
    bar.update(len(samples), len(shards), final=True)
    return manifest


def verify(location: str) -> int:
    """`spdl-shard verify MANIFEST`: every shard the manifest lists (local files next to it, or
    objects next to it below an s3:// prefix) has its bytes and sha256. 0 when all do, else 1."""
    remote = location.startswith("s3://")
    try:
        if remote:
            prefix, _, mname = location.rpartition("/")
            store = S3Writer(prefix)
            got: list = []

            def keep(resp) -> str:
                got[:] = [resp.read()]
                return ""

            store._request("GET", mname, keep)
            text = got[0]

            def digest(fname: str) -> tuple:
                return store.get_digest(fname)
        else:
            path = Path(location)
            try:
                text = path.read_bytes()
            except OSError as e:
                raise ShardError(f"{location}: {e.strerror}") from e

            def digest(fname: str) -> tuple:
                sha, n = hashlib.sha256(), 0
                with open(path.parent / fname, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        sha.update(chunk)
                        n += len(chunk)
                return n, sha.hexdigest()
        try:
            manifest = json.loads(text)
            shards = manifest["shards"]
        except (ValueError, KeyError, TypeError) as e:
            raise ShardError(f"{location}: not a spdl-shard manifest ({e})") from e
        bad = 0
        for sh in shards:
            try:
                n, sha = digest(sh["file"])
            except (OSError, ShardError) as e:
                print(f"spdl-shard: {sh['file']}: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
                bad += 1
                continue
            if (n, sha) != (sh["bytes"], sh["sha256"]):
                print(f"spdl-shard: {sh['file']}: {n} bytes, sha256 {sha}; the manifest says {sh['bytes']} bytes, "
                      f"sha256 {sh['sha256']}", file=sys.stderr)
                bad += 1
    except ShardError as e:
        print(f"spdl-shard: {e}", file=sys.stderr)
        return 1
    if bad:
        print(f"spdl-shard: {bad} of {len(shards)} shards do not match {location}", file=sys.stderr)
        return 1
    print(f"ok: {len(shards)} shards, {sum(sh['samples'] for sh in shards)} samples match {location}")
    return 0


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "verify":
        if len(argv) != 2 or argv[1].startswith("-"):
            print("usage: spdl-shard verify MANIFEST (a NAME.manifest.json path or s3:// URL)", file=sys.stderr)
            return 0 if argv[1:] in (["-h"], ["--help"]) else 2
        return verify(argv[1])
    p = argparse.ArgumentParser(
        prog="spdl-shard",
        description="Write an image folder, a file list or a COCO set as WebDataset tar shards "
                    "(NAME-000000.tar ... and NAME.manifest.json) in a folder or below an s3:// prefix. "
                    "`spdl-shard verify MANIFEST` checks written shards against their manifest.")
    p.add_argument("output", help="output folder, or s3://bucket/prefix")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--folder", type=Path, help="an image folder: root/<class>/<file>")
    src.add_argument("--list", type=Path, help="a file list: path[,label] lines")
    src.add_argument("--coco", type=Path, metavar="ANNOTATIONS", help="a COCO instances JSON (with --root)")
    p.add_argument("--root", type=Path, help="the folder list paths / COCO file_names are relative to")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--shard-size", type=int, help="samples per shard (default 1000)")
    size.add_argument("--shard-bytes", type=parse_bytes, help="bytes per shard at most (e.g. 512M); a larger "
                      "sample gets a shard of its own")
    p.add_argument("--name", default="shard", help="shard file prefix (default: shard)")
    p.add_argument("--max-side", type=int, help="scale images down so that the longer side is at most N")
    p.add_argument("--quality", type=int, help="JPEG quality of re-encoded images, 1..95 (default 90; given, "
                   "every image is re-encoded)")
    p.add_argument("--extensions", default=",".join(IMAGE_EXTENSIONS),
                   help="image extensions taken from a folder (default: jpg,jpeg,png,webp)")
    p.add_argument("--sidecar", action="append", default=[], metavar="EXT",
                   help="carry the file next to each image with this extension (a/1.jpg -> a/1.EXT) as a "
                        "member; repeatable")
    p.add_argument("--workers", type=int, help="processes reading and re-encoding images (default: the CPUs, "
                   "at most 8, when re-encoding; else 1); the output is the same for any number")
    p.add_argument("--shuffle", type=int, metavar="SEED", help="shuffle the samples across shards with this seed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (default: shown on a terminal)")
    a = p.parse_args(argv)
    try:
        if a.shard_size is not None and a.shard_size < 1:
            raise ShardError("--shard-size must be >= 1")
        if a.max_side is not None and a.max_side < 1:
            raise ShardError("--max-side must be >= 1")
        if a.quality is not None and not 1 <= a.quality <= 95:
            raise ShardError("--quality must be in 1..95")
        if "/" in a.name or not a.name:
            raise ShardError("--name must be a plain file name prefix")
        sidecars = [s.lstrip(".").lower() for s in a.sidecar]
        for s in sidecars:
            if not s or s in IMAGE_EXTENSIONS or s in ("cls", "json"):
                raise ShardError(f"--sidecar {s!r}: not a usable sidecar extension")
        if a.max_side is not None or a.quality is not None:
            if importlib.util.find_spec("PIL") is None:
                raise ShardError("--max-side / --quality need Pillow (Debian: python3-pil)")
        classes = categories = None
        if a.folder is not None:
            exts = tuple(e.strip().lstrip(".").lower() for e in a.extensions.split(",") if e.strip())
            samples, classes = folder_samples(a.folder, exts)
            desc = f"folder {a.folder}"
        elif a.list is not None:
            samples = list_samples(a.list, a.root)
            desc = f"list {a.list}"
        else:
            if a.root is None:
                raise ShardError("--coco needs --root (the image folder)")
            samples, categories = coco_samples(a.coco, a.root)
            desc = f"coco {a.coco}"
        for s in samples:
            if a.max_side is None and a.quality is None and image_ext(s.image) not in IMAGE_EXTENSIONS:
                raise ShardError(f"{s.source}: extension '.{image_ext(s.image)}' is not one the tar source "
                                 f"reads ({', '.join(IMAGE_EXTENSIONS)}); re-encode with --quality")
        if a.shuffle is not None:
            random.Random(a.shuffle).shuffle(samples)
        if a.workers is not None and a.workers < 1:
            raise ShardError("--workers must be >= 1")
        reencoding = a.max_side is not None or a.quality is not None
        workers = a.workers if a.workers is not None else (min(os.cpu_count() or 1, 8) if reencoding else 1)
        shard_size = a.shard_size if a.shard_size is not None or a.shard_bytes is not None else 1000
        m = write_shards(samples, a.output, a.name, shard_size, a.shard_bytes, a.max_side, a.quality, sidecars,
                         classes, categories, progress=not a.no_progress and sys.stderr.isatty(), input_desc=desc,
                         workers=workers)
    except ShardError as e:
        print(f"spdl-shard: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("spdl-shard: interrupted", file=sys.stderr)
        return 130
    where = a.output.rstrip("/")
    print(f"wrote {m['samples']} samples in {len(m['shards'])} shards: {where}/{m['pattern']} "
          f"(manifest {where}/{a.name}.manifest.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
