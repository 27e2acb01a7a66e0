#!/bin/bash
# The CUDA runtime is linked statically and the driver loaded only when a GPU job needs it, so
# spdld and the Python module start, and run CPU jobs, on machines without CUDA (issue: a build
# that needs libcudart.so.13 does not even start there). For each binary given: no libcudart.so*
# nor libcuda.so* among its NEEDED libraries, and (spdld) it starts with no CUDA library findable.
# Usage: no_shared_cuda.sh SPDLD [PYTHON_MODULE...]
set -euo pipefail
fail=0
for bin in "$@"; do
  if [[ ! -f "$bin" ]]; then
    echo "FAIL: $bin does not exist"
    fail=1
    continue
  fi
  needed=$(readelf -d "$bin" | awk '/NEEDED/ {print $NF}' | tr -d '[]')
  if grep -E '^lib(cudart|cuda)\.so' <<<"$needed"; then
    echo "FAIL: $bin needs a shared CUDA library (above): it would not start without CUDA"
    fail=1
  else
    echo "ok: $bin needs no shared CUDA library"
  fi
done
# And spdld starts with the loader cache bypassed (--inhibit-cache) and a library path holding only
# links to the libraries it needs that are not CUDA's. (A smoke check: a RUNPATH into a toolkit
# would still be searched; the NEEDED check above is what proves no shared CUDA library is needed.)
spdld="$1"
loader=$(readelf -l "$spdld" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
if [[ -n "$loader" && -x "$loader" ]]; then
  libs=$(mktemp -d)
  trap 'rm -rf "$libs"' EXIT
  while read -r name _ path _; do
    [[ "$path" == /* ]] || continue
    [[ "$name" =~ ^lib(cudart|cuda)\.so ]] && continue
    ln -sf "$path" "$libs/$name"
  done < <(ldd "$spdld")
  if out=$("$loader" --inhibit-cache --library-path "$libs" "$spdld" --version 2>&1); then
    echo "ok: spdld starts with no CUDA library findable: $out"
  else
    echo "FAIL: spdld does not start without CUDA libraries: $out"
    fail=1
  fi
fi
exit $fail
