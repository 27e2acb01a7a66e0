#!/usr/bin/env bash
# Installs the build into a staging tree (cmake --install, DESTDIR) and checks what lands where;
# builds the .deb with CPack and checks its contents (dpkg-deb -c), its Depends (from shlibdeps)
# and conffiles; compiles and links a small program against the staged client library through
# its pkg-config file. Exit 77 (ctest: Skipped) when dpkg-deb or cpack is missing.
set -euo pipefail
build_dir=$1
src_dir=$(cd "$(dirname "$0")/../.." && pwd)
for tool in dpkg-deb cpack pkg-config; do
  command -v $tool >/dev/null || { echo "SKIPPED: $tool not installed"; exit 77; }
done
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

echo "== cmake --install (DESTDIR, prefix /usr)"
DESTDIR=$tmp/stage cmake --install "$build_dir" --prefix /usr >"$tmp/install.log"
for f in usr/bin/spdld usr/bin/spdlctl usr/bin/spdl-client usr/lib/systemd/system/spdld.service usr/lib/systemd/system/spdld.socket \
         usr/lib/sysusers.d/spdld.conf etc/spdld/spdld.yaml usr/share/spdld/examples/imagenet.yaml \
         usr/include/spdl/client.h usr/include/spdl/control.h usr/include/spdl/common/status.h \
         usr/include/spdl/proto/control.pb.h usr/share/doc/spdld/README.md; do
  [ -e "$tmp/stage/$f" ] || fail "cmake --install did not install /$f"
done
libdir=$(cd "$tmp/stage/usr" && dirname "$(find . -name libspdl_client.a | head -1)" | sed 's#^\./##')
[ -n "$libdir" ] && [ -f "$tmp/stage/usr/$libdir/pkgconfig/spdl-client.pc" ] || fail "no client library or spdl-client.pc"
grep -q '^ExecStart=/usr/bin/spdld --config /etc/spdld/spdld.yaml' "$tmp/stage/usr/lib/systemd/system/spdld.service" \
  || fail "the installed unit does not start /usr/bin/spdld"
grep -q '^prefix=/usr$' "$tmp/stage/usr/$libdir/pkgconfig/spdl-client.pc" || fail "spdl-client.pc has the wrong prefix"

echo "== a program built against the installed client library (pkg-config)"
cat > "$tmp/hello.cc" <<'CC'
#include <spdl/client.h>
#include <spdl/control.h>
#include <cstdio>
int main() {
  spdl::proto::ClientMessage m;
  m.mutable_status();
  auto r = spdl::client::ControlCall("/nonexistent/spdld.sock", m);
  std::printf("%s\n", r.ok() ? "connected?" : r.status().message().c_str());
  return r.ok() ? 1 : 0;
}
CC
export PKG_CONFIG_SYSROOT_DIR=$tmp/stage PKG_CONFIG_PATH=$tmp/stage/usr/$libdir/pkgconfig
# shellcheck disable=SC2046
c++ -std=c++20 "$tmp/hello.cc" -o "$tmp/hello" $(pkg-config --cflags --libs spdl-client) || fail "cannot build against spdl-client.pc"
"$tmp/hello" || fail "the program linked against the client library did not run"

echo "== cpack refuses to package a build with test hooks"
if grep -q '^SPDL_TEST_HOOKS:BOOL=ON' "$build_dir/CMakeCache.txt"; then
  if (cd "$build_dir" && cpack -G DEB -B "$tmp/refused" >"$tmp/refused.log" 2>&1); then
    fail "cpack packaged a build made with SPDL_TEST_HOOKS=ON"
  fi
  grep -q 'SPDL_TEST_HOOKS=ON' "$tmp/refused.log" || { cat "$tmp/refused.log"; fail "cpack failed, but not for the hooks"; }
fi

echo "== cpack -G DEB"
# This is the test build (SPDL_TEST_HOOKS=ON): cpack refuses it unless told this is on purpose.
(cd "$build_dir" && SPDL_PACKAGE_TEST_BUILD=1 cpack -G DEB -B "$tmp/pkg" >"$tmp/cpack.log" 2>&1) || { cat "$tmp/cpack.log"; fail "cpack failed"; }
deb=$(ls "$tmp"/pkg/*.deb | head -1)
[ -f "$deb" ] || fail "no .deb"
echo "$(basename "$deb") $(du -h "$deb" | cut -f1)"
dpkg-deb -c "$deb" > "$tmp/contents"
for f in ./usr/bin/spdld ./usr/bin/spdlctl ./usr/bin/spdl-client ./usr/lib/systemd/system/spdld.service ./usr/lib/systemd/system/spdld.socket \
         ./usr/lib/sysusers.d/spdld.conf ./etc/spdld/spdld.yaml ./usr/share/spdld/examples/imagenet.yaml \
         ./usr/include/spdl/client.h ./usr/$libdir/libspdl_client.a ./usr/$libdir/pkgconfig/spdl-client.pc; do
  grep -q " $f\$" "$tmp/contents" || fail "the .deb lacks $f"
done
depends=$(dpkg-deb -f "$deb" Depends)
echo "Depends: $depends"
for lib in libc6 libprotobuf libyaml-cpp libturbojpeg libavcodec; do
  echo "$depends" | grep -q "$lib" || fail "Depends lacks $lib (shlibdeps)"
done
dpkg-deb -e "$deb" "$tmp/control"
grep -qx /etc/spdld/spdld.yaml "$tmp/control/conffiles" || fail "/etc/spdld/spdld.yaml is not a conffile"
[ -x "$tmp/control/postinst" ] || fail "no postinst"
echo "OK: install tree and .deb as expected"
