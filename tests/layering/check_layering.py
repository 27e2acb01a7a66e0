#!/usr/bin/env python3
"""Checks that every #include "..." in the product's sources goes the allowed way (CODING.md).

The parts, by include root, and what each may include (itself always):

    base      base/common       nothing else
    proto     proto/            base
    config    daemon/config     base
    io, media, shm              base, proto, config
    streams   daemon/streams    base, proto, config
    gpu       gpu/cuda          base, proto
    pipeline  daemon/pipeline   the above
    jobs      daemon/jobs       the above
    server, ops                 the above (not each other)
    daemon    daemon/*.cc|h     everything above
    client    client/           base, proto, gpu
    testing   testing/          base, proto, config, io, media, shm, gpu, datagen (test code only)
    datagen   tools/datagen     base (spdl-make-dataset's writer: it ships, so never testing/)

A lower part never includes a higher one, the client never includes the daemon, and testing/ (fakes,
encoders for tests) is included by the product only inside `#if SPDL_TEST_HOOKS` blocks. tests/,
bench/ and the rest of tools/ may include anything and are not scanned.

An include is resolved the way the compiler would: next to the including file, then in each include
root (base/, gpu/, testing/, daemon/, the repository root for proto/, client/**/include/), by which
directory holds the file; a path that is not there (a generated header) is assigned by its first
component.

    check_layering.py [ROOT]     exit 0: no violation; 1: violations (each printed); 2: usage
    check_layering.py --self-test  builds a tree with known violations and checks that each is found
"""
import os
import re
import sys
import tempfile

RANK = {
    "base": 0,
    "proto": 1,
    "config": 2,
    "io": 3, "media": 3, "shm": 3, "streams": 3, "gpu": 3,
    "pipeline": 4,
    "jobs": 5,
    "server": 6, "ops": 6,
    "daemon": 7,
}
# Explicit allow lists where rank alone is not the rule.
ALLOWED = {
    "base": set(),
    "proto": {"base"},
    "config": {"base"},
    "io": {"base", "proto", "config"},
    "media": {"base", "proto", "config"},
    "shm": {"base", "proto", "config"},
    "streams": {"base", "proto", "config"},
    "gpu": {"base", "proto"},
    "client": {"base", "proto", "gpu"},
    "testing": {"base", "proto", "config", "io", "media", "shm", "gpu", "datagen"},
    "datagen": {"base"},
}
DAEMON_PARTS = ["config", "io", "media", "shm", "streams", "pipeline", "jobs", "server", "ops"]
SCANNED_EXT = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh")


def allowed(src, dst):
    if src == dst:
        return True
    if src in ALLOWED:
        return dst in ALLOWED[src]
    # daemon parts above shm: anything of strictly lower rank (so never client or testing).
    return dst in RANK and RANK[dst] < RANK[src]


def part_of(root, path):
    """The part a file belongs to (None: not scanned)."""
    rel = os.path.relpath(path, root).replace(os.sep, "/")
    top = rel.split("/")[0]
    if top == "base":
        return "base"
    if top == "proto":
        return "proto"
    if top == "gpu":
        return "gpu"
    if top == "testing":
        return "testing"
    if top == "client":
        return "client"
    if top == "tools":
        parts = rel.split("/")
        return "datagen" if len(parts) > 2 and parts[1] == "datagen" else None
    if top == "daemon":
        parts = rel.split("/")
        if len(parts) == 2:
            return "daemon"
        return parts[1] if parts[1] in DAEMON_PARTS else None
    return None


def include_roots(root):
    roots = [("base", os.path.join(root, "base")), ("gpu", os.path.join(root, "gpu")),
             ("testing", os.path.join(root, "testing")), ("daemon", os.path.join(root, "daemon")),
             ("tools", os.path.join(root, "tools")), ("root", root)]
    client = os.path.join(root, "client")
    for dirpath, dirnames, _ in os.walk(client):
        if os.path.basename(dirpath) == "include":
            roots.append(("client", dirpath))
            dirnames[:] = []
    return roots


def resolve(root, roots, including, inc):
    """The part an #include "inc" in file `including` refers to, or None (not the project's)."""
    here = os.path.join(os.path.dirname(including), inc)
    if os.path.isfile(here):
        return part_of(root, os.path.normpath(here))
    for _, r in roots:
        p = os.path.join(r, inc)
        if os.path.isfile(p):
            return part_of(root, os.path.normpath(p))
    first = inc.split("/")[0]
    if first == "common":
        return "base"
    if first == "proto":
        return "proto"
    if first == "cuda":
        return "gpu"
    if first == "spdl":
        return "client"
    if first in DAEMON_PARTS:
        return first
    if first == "datagen":
        return "datagen"
    return None


IF_RE = re.compile(r"^\s*#\s*(if|ifdef|ifndef)\b(.*)$")
ELSE_RE = re.compile(r"^\s*#\s*(else|elif)\b(.*)$")
ENDIF_RE = re.compile(r"^\s*#\s*endif\b")
INC_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def scan_file(root, roots, path):
    """Yields (line number, include, target part, inside an SPDL_TEST_HOOKS block)."""
    stack = []  # per open #if: is the current branch guarded by SPDL_TEST_HOOKS?
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = IF_RE.match(line)
            if m:
                cond = m.group(2)
                stack.append(m.group(1) != "ifndef" and "SPDL_TEST_HOOKS" in cond and "!" not in cond)
                continue
            m = ELSE_RE.match(line)
            if m:
                if stack:
                    stack[-1] = m.group(1) == "elif" and "SPDL_TEST_HOOKS" in m.group(2) and "!" not in m.group(2)
                continue
            if ENDIF_RE.match(line):
                if stack:
                    stack.pop()
                continue
            m = INC_RE.match(line)
            if m:
                target = resolve(root, roots, path, m.group(1))
                if target is not None:
                    yield n, m.group(1), target, any(stack)


def check(root):
    root = os.path.abspath(root)
    roots = include_roots(root)
    violations = []
    for top in ("base", "proto", "gpu", "testing", "client", "daemon", "tools"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SCANNED_EXT):
                    continue
                path = os.path.join(dirpath, name)
                src = part_of(root, path)
                if src is None:
                    continue
                for n, inc, dst, hooks in scan_file(root, roots, path):
                    rel = os.path.relpath(path, root)
                    if dst == "testing" and src != "testing":
                        if not hooks:
                            violations.append(f"{rel}:{n}: {src} includes test-only \"{inc}\" (testing/) "
                                              "outside an #if SPDL_TEST_HOOKS block")
                        continue
                    if not allowed(src, dst):
                        violations.append(f"{rel}:{n}: {src} may not include {dst} (\"{inc}\")")
    return violations


def self_test():
    """A tree with one file per rule broken, and some that are fine; every bad one must be found."""
    files = {
        "base/common/status.h": '#include <string>\n',
        "base/common/bad_up.h": '#include "jobs/job_registry.h"\n',                 # base -> jobs
        "proto/framing.h": '#include "common/status.h"\n',                           # fine
        "gpu/cuda/device_backend.h": '#include "common/status.h"\n#include "proto/control.pb.h"\n',  # fine
        "gpu/cuda/bad.cc": '#include "media/image_decoder.h"\n',                    # gpu -> media
        "testing/cuda/fake_backend.h": '#include "cuda/device_backend.h"\n',        # fine
        "daemon/media/image_decoder.h": '#include "common/status.h"\n',             # fine
        "daemon/io/bad.cc": '#include "pipeline/thread_pool.h"\n',                  # io -> pipeline
        "daemon/pipeline/thread_pool.h": '#include "shm/slot_ring.h"\n',            # fine
        "daemon/shm/slot_ring.h": '\n',
        "daemon/jobs/job_registry.h": '#include "cuda/device_backend.h"\n',         # fine
        "daemon/jobs/bad_fake.cc": '#include "cuda/fake_backend.h"\n',              # testing, unguarded
        "daemon/server/bad.cc": '#include "ops/metrics.h"\n',                       # server -> ops (peers)
        "daemon/ops/metrics.h": '\n',
        "daemon/daemon.cc": ('#include "daemon.h"\n#include "jobs/job_registry.h"\n'
                             '#if SPDL_TEST_HOOKS\n#include "cuda/fake_backend.h"\n#endif\n'),  # fine
        "daemon/daemon.h": '\n',
        "daemon/bad_else.cc": ('#if SPDL_TEST_HOOKS\n#else\n#include "cuda/fake_backend.h"\n#endif\n'),  # else branch
        "client/include/spdl/client.h": '#include "common/status.h"\n',             # fine
        "client/bad.cc": '#include "spdl/client.h"\n#include "jobs/job_registry.h"\n',  # client -> daemon part
        "client/cuda/bad2.cc": '#include "daemon.h"\n',                             # client -> daemon/daemon.h
        "tools/datagen/bad.cc": '#include "media/jpeg_encoder.h"\n',              # shipped writer -> testing
        "tools/datagen/ok.cc": '#include "common/status.h"\n',                    # fine
        "testing/media/jpeg_encoder.h": '#include "datagen/ok.h"\n',              # fine
        "tools/datagen/ok.h": '\n',
        "client/cuda/fine.cc": '#include "nothere.h"\n#include "spdl/client.h"\n',   # unresolved: not ours
    }
    expected = {"base/common/bad_up.h:1", "gpu/cuda/bad.cc:1", "daemon/io/bad.cc:1", "daemon/jobs/bad_fake.cc:1",
                "daemon/server/bad.cc:1", "daemon/bad_else.cc:3", "client/bad.cc:2",
                "client/cuda/bad2.cc:1", "tools/datagen/bad.cc:1"}
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in files.items():
            p = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(text)
        found = {v.split(": ")[0] for v in check(tmp)}
    ok = found == expected
    print("self-test:", "OK" if ok else "FAILED")
    for missing in sorted(expected - found):
        print("  not found:", missing)
    for extra in sorted(found - expected):
        print("  wrongly reported:", extra)
    return 0 if ok else 1


def main(argv):
    if len(argv) > 2:
        print(__doc__)
        return 2
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    root = argv[1] if len(argv) == 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    violations = check(root)
    for v in violations:
        print(v)
    print(f"layering: {len(violations)} violation(s)")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
