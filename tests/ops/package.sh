#!/usr/bin/env bash
# Installs the build into a staging tree (cmake --install, DESTDIR) and checks what lands where;
# builds the .deb with CPack and checks its contents (dpkg-deb -c), its Depends (from shlibdeps)
# and conffiles; runs the service set-up (systemd-sysusers, systemd-tmpfiles, systemctl enable) in
# the staging root as README.md's operations section does on a machine; compiles and links a small program against the staged client library through
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
for f in usr/bin/spdld usr/bin/spdlctl usr/bin/spdl-client usr/bin/spdl-make-dataset usr/bin/spdl-shard usr/lib/systemd/system/spdld.service usr/lib/systemd/system/spdld.socket \
         usr/lib/sysusers.d/spdld.conf etc/spdld/spdld.yaml usr/share/spdld/examples/imagenet.yaml \
         usr/include/spdl/client.h usr/include/spdl/control.h usr/include/spdl/common/status.h \
         usr/include/spdl/proto/control.pb.h usr/include/spdl/op.h usr/share/doc/spdld/README.md; do
  [ -e "$tmp/stage/$f" ] || fail "cmake --install did not install /$f"
done
libdir=$(cd "$tmp/stage/usr" && dirname "$(find . -name libspdl_client.a | head -1)" | sed 's#^\./##')
[ -n "$libdir" ] && [ -f "$tmp/stage/usr/$libdir/pkgconfig/spdl-client.pc" ] || fail "no client library or spdl-client.pc"
grep -q '^ExecStart=/usr/bin/spdld --config /etc/spdld/spdld.yaml' "$tmp/stage/usr/lib/systemd/system/spdld.service" \
  || fail "the installed unit does not start /usr/bin/spdld"
grep -q '^prefix=/usr$' "$tmp/stage/usr/$libdir/pkgconfig/spdl-client.pc" || fail "spdl-client.pc has the wrong prefix"
[ -x "$tmp/stage/usr/bin/spdl-shard" ] && "$tmp/stage/usr/bin/spdl-shard" --help | grep -q -- --shard-bytes \
  || fail "the installed spdl-shard does not run"

echo "== the README's service steps in the staging root: systemd-sysusers, systemd-tmpfiles, systemctl enable"
for f in usr/lib/tmpfiles.d/spdld.conf usr/share/doc/spdld/LICENSE usr/share/doc/spdld/spdld-network.conf; do
  [ -e "$tmp/stage/$f" ] || fail "cmake --install did not install /$f"
done
if command -v systemd-sysusers >/dev/null && command -v systemd-tmpfiles >/dev/null && command -v systemctl >/dev/null; then
  root=$tmp/stage
  mkdir -p "$root/etc"
  # README.md's own lines (Operations), run against the staging root (--root after the program name).
  readme_line() { grep -E "^$1 " "$src_dir/README.md" | head -1 | sed 's/ *#.*//'; }
  sysusers=$(readme_line systemd-sysusers) tmpfiles=$(readme_line systemd-tmpfiles)
  [ -n "$sysusers" ] && [ -n "$tmpfiles" ] || fail "README.md lost its systemd-sysusers / systemd-tmpfiles lines"
  echo "README: $sysusers; $tmpfiles"
  # shellcheck disable=SC2086
  systemd-sysusers --root="$root" ${sysusers#systemd-sysusers } || fail "$sysusers (--root) failed"
  uid=$(awk -F: '$1 == "spdld" { print $3 }' "$root/etc/passwd")
  gid=$(awk -F: '$1 == "spdld" { print $3 }' "$root/etc/group")
  [ -n "$uid" ] && [ -n "$gid" ] || fail "no user or group spdld after systemd-sysusers"
  # shellcheck disable=SC2086
  systemd-tmpfiles --root="$root" ${tmpfiles#systemd-tmpfiles } || fail "$tmpfiles (--root) failed"
  for d in var/lib/spdld run/spdld; do
    [ "$(stat -c '%u:%g %a' "$root/$d")" = "$uid:$gid 755" ] || fail "/$d is $(stat -c '%u:%g %a' "$root/$d"), not spdld's 0755"
  done
  systemctl --root="$root" enable spdld.service >/dev/null 2>&1 || fail "systemctl --root enable spdld failed"
  [ -L "$root/etc/systemd/system/multi-user.target.wants/spdld.service" ] || fail "spdld.service not enabled"
  [ -L "$root/etc/systemd/system/sockets.target.wants/spdld.socket" ] || fail "spdld.socket not enabled with it (Also=)"
  echo "user spdld $uid:$gid, /var/lib/spdld and /run/spdld, spdld.service and spdld.socket enabled"
else
  echo "SKIPPED part: systemd-sysusers / systemd-tmpfiles / systemctl missing (apt-get install systemd)"
fi

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

echo "== an op library built with cc against the installed spdl/op.h alone"
cc -O2 -shared -fPIC -I"$tmp/stage/usr/include" -o "$tmp/libexample_ops.so" "$src_dir/examples/ops/example_ops.c" -lm \
  || fail "the example op does not build against the installed spdl/op.h"
nm -D --defined-only "$tmp/libexample_ops.so" | grep -q ' T spdl_ops$' || fail "the op library does not export spdl_ops"

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
for f in ./usr/bin/spdld ./usr/bin/spdlctl ./usr/bin/spdl-client ./usr/bin/spdl-make-dataset ./usr/bin/spdl-shard ./usr/lib/systemd/system/spdld.service ./usr/lib/systemd/system/spdld.socket \
         ./usr/lib/sysusers.d/spdld.conf ./etc/spdld/spdld.yaml ./usr/share/spdld/examples/imagenet.yaml \
         ./usr/include/spdl/client.h ./usr/$libdir/libspdl_client.a ./usr/$libdir/pkgconfig/spdl-client.pc; do
  grep -q " $f\$" "$tmp/contents" || fail "the .deb lacks $f"
done
dpkg-deb -f "$deb" Recommends | grep -q python3-pil || fail "Recommends lacks python3-pil (spdl-shard)"
depends=$(dpkg-deb -f "$deb" Depends)
echo "Depends: $depends"
for lib in libc6 libprotobuf libyaml-cpp libturbojpeg libavcodec; do
  echo "$depends" | grep -q "$lib" || fail "Depends lacks $lib (shlibdeps)"
done
dpkg-deb -e "$deb" "$tmp/control"
grep -qx /etc/spdld/spdld.yaml "$tmp/control/conffiles" || fail "/etc/spdld/spdld.yaml is not a conffile"
[ -x "$tmp/control/postinst" ] || fail "no postinst"
grep -q "systemd-sysusers /usr/lib/sysusers.d/spdld.conf" "$tmp/control/postinst" || fail "postinst does not run systemd-sysusers"
grep -q "systemd-tmpfiles --create /usr/lib/tmpfiles.d/spdld.conf" "$tmp/control/postinst" || fail "postinst does not run systemd-tmpfiles"
grep -q " ./usr/lib/tmpfiles.d/spdld.conf\$" "$tmp/contents" || fail "the .deb lacks tmpfiles.d/spdld.conf"
echo "OK: install tree and .deb as expected"
