#!/usr/bin/env bash
# The Python client as a user installs it: builds the wheel (`pip wheel ./client/python`:
# scikit-build-core and pybind11 from PyPI), installs it into fresh venvs and runs the Python test
# suite (tests/python) against the installed package (SPDL_TEST_INSTALLED=1) and the build tree's
# spdld:
#   1. Debian's python3 with Debian's numpy 1.24 and torch (a venv with --system-site-packages);
#   2. the same venv kind with numpy 2.x from PyPI installed over Debian's;
#   3. each interpreter named in $SPDL_WHEEL_PYTHONS (e.g. "python3.10 python3.12 python3.13"):
#      its own wheel, in a plain venv with numpy 2.x, PyYAML, Pillow and pytest from PyPI (no
#      torch there: the tests that need it are skipped, and say so).
# SPDL_WHEEL_SKIP_SYSTEM=1 skips 1 and 2. Needs pip's access to PyPI. Usage: scripts/test-wheel.sh [BUILD_DIR] (default: build; spdld,
# spdl-make-dataset, spdlctl and spdl-client are built there if missing). Exit status: pytest's.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build}" && pwd)"
SYSTEM_PY=/usr/bin/python3

need=()
for t in spdld spdl-make-dataset spdlctl spdl-client; do
  [[ -x "$BUILD/bin/$t" ]] || need+=("$t")
done
if ((${#need[@]})); then
  cmake --build "$BUILD" --target "${need[@]}"
fi

WORK="$(mktemp -d /tmp/spdl-wheel.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

t0=$SECONDS
say() { echo "test-wheel: $* ($(( SECONDS - t0 )) s)"; }

# build_wheel PYTHON OUTDIR: the wheel for that interpreter (build isolation fetches the backend).
build_wheel() {
  "$1" -m venv "$WORK/build-env"
  "$WORK/build-env/bin/pip" wheel -q --no-deps "$ROOT/client/python" -w "$2"
  rm -rf "$WORK/build-env"
}

# run_suite VENV LABEL: pytest against the installed spdl_client (never the build tree's).
run_suite() {
  local py="$1/bin/python"
  "$py" - <<'PY'
import sys, numpy, spdl_client
assert "site-packages" in spdl_client.__file__, spdl_client.__file__
print(f"test-wheel: Python {sys.version.split()[0]}, numpy {numpy.__version__}, spdl_client {spdl_client.__version__} from {spdl_client.__file__}")
PY
  (cd "$WORK" && SPDL_TEST_INSTALLED=1 SPDL_BUILD_DIR="$BUILD" "$py" -m pytest -q -rs -p no:cacheprovider \
    "$ROOT/tests/python")
  say "$2: passed"
}

if [[ "${SPDL_WHEEL_SKIP_SYSTEM:-0}" == 1 ]]; then SYSTEM_RUNS=0; else SYSTEM_RUNS=1; fi
if ((SYSTEM_RUNS)); then
build_wheel "$SYSTEM_PY" "$WORK/dist-system"
say "built $(basename "$WORK"/dist-system/*.whl)"

"$SYSTEM_PY" -m venv --system-site-packages "$WORK/debian"
"$WORK/debian/bin/pip" install -q "$WORK"/dist-system/*.whl
run_suite "$WORK/debian" "Debian's numpy and torch"

"$SYSTEM_PY" -m venv --system-site-packages "$WORK/pypi"
"$WORK/pypi/bin/pip" install -q "$WORK"/dist-system/*.whl "numpy>=2"
run_suite "$WORK/pypi" "numpy 2 from PyPI"
fi

for py in ${SPDL_WHEEL_PYTHONS:-}; do
  name="python$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  build_wheel "$py" "$WORK/dist-$name"
  "$py" -m venv "$WORK/venv-$name"
  "$WORK/venv-$name/bin/pip" install -q "$WORK/dist-$name"/*.whl "numpy>=2" pytest Pillow
  run_suite "$WORK/venv-$name" "$name"
done
say "all passed"
