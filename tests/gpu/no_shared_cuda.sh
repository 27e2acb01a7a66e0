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
# spdld starts where no CUDA library can be found (an empty library path, the cache bypassed by
# running the dynamic loader with --inhibit-cache).
spdld="$1"
loader=$(readelf -l "$spdld" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
if [[ -n "$loader" && -x "$loader" ]]; then
  dirs=$(ldd "$spdld" | awk '/=> \// {print $3}' | grep -v -E 'lib(cudart|cuda)\.so' | xargs -r -n1 dirname | sort -u | paste -sd:)
  if out=$("$loader" --inhibit-cache --library-path "$dirs" "$spdld" --version 2>&1); then
    echo "ok: spdld starts with no CUDA library findable: $out"
  else
    echo "FAIL: spdld does not start without CUDA libraries: $out"
    fail=1
  fi
fi
exit $fail
