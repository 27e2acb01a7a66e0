#!/usr/bin/env bash
# systemd-analyze verify on the configured units (build/systemd/spdld.service and spdld.socket, the
# socket-activation unit, checked together so its Service= and the service's Also= resolve), with ExecStart
# pointed at the build's spdld so the check does not need an installed binary. Any warning about
# the unit (unknown key, bad value) fails the test. Exit 77 (ctest: Skipped) when systemd-analyze
# is missing or cannot run here.
set -uo pipefail
build_dir=$1
unit=$build_dir/systemd/spdld.service
if ! command -v systemd-analyze >/dev/null; then
  echo "SKIPPED: systemd-analyze not installed (apt-get install systemd)"; exit 77
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cp "$build_dir/systemd/spdld.socket" "$tmp/spdld.socket" || { echo "FAIL: no $build_dir/systemd/spdld.socket"; exit 1; }
sed "s#^ExecStart=[^ ]*/spdld #ExecStart=$build_dir/bin/spdld #" "$unit" > "$tmp/spdld.service"
grep -q "^ExecStart=$build_dir/bin/spdld " "$tmp/spdld.service" || { echo "FAIL: no ExecStart in $unit"; exit 1; }
out=$(systemd-analyze verify "$tmp/spdld.socket" "$tmp/spdld.service" 2>&1); rc=$?
echo "$out"
if [ $rc -ne 0 ] && echo "$out" | grep -qiE "failed to (connect|initialize)|not booted|no such file or directory.*(/run/systemd|bus)"; then
  echo "SKIPPED: systemd-analyze cannot run in this container"; exit 77
fi
[ $rc -eq 0 ] || { echo "FAIL: systemd-analyze verify exited $rc"; exit 1; }
if echo "$out" | grep -qE "spdld\.(service|socket)"; then echo "FAIL: warnings about the units"; exit 1; fi
grep -q "^ListenStream=/run/spdld/spdld.sock$" "$tmp/spdld.socket" || { echo "FAIL: spdld.socket does not listen on /run/spdld/spdld.sock"; exit 1; }

# The rules every advertised feature needs, read from the unit (the last assignment of a key wins,
# as in systemd; DeviceAllow= accumulates).
src_dir=$(cd "$(dirname "$0")/../.." && pwd)
last() { grep -E "^$1=" "$unit" | tail -1 | cut -d= -f2-; }
fail() { echo "FAIL: $*"; exit 1; }
[ "$(last Type)" = notify ] || fail "unit is not Type=notify"
[ "$(last User)" = spdld ] || fail "User= is not spdld"
# GPU delivery (output.device: cuda:N): the NVIDIA devices are allowed, not hidden.
case "$(last PrivateDevices)" in yes | true | on | 1) fail "PrivateDevices=yes hides the GPUs" ;; esac
[ "$(last DevicePolicy)" = closed ] || fail "DevicePolicy= is not closed (devices not allowed by name stay hidden)"
for dev in /dev/nvidiactl /dev/nvidia-uvm char-nvidia-frontend; do
  grep -qE "^DeviceAllow=$dev rw$" "$unit" || fail "no DeviceAllow=$dev rw"
done
# http/s3 sources: no address filter in the unit itself (a drop-in may add one).
grep -qE "^IPAddress(Deny|Allow)=" "$unit" && fail "the unit filters addresses: http sources fail under it"
grep -E "^RestrictAddressFamilies=" "$unit" | grep -q AF_INET6 || fail "RestrictAddressFamilies= lacks AF_INET/AF_INET6"
# Data under /tmp and /home stays visible (read-only).
case "$(last PrivateTmp)" in yes | true | on | 1) fail "PrivateTmp=yes hides data under /tmp" ;; esac
case "$(last ProtectHome)" in yes | true | tmpfs) fail "ProtectHome= hides data under /home" ;; esac
[ "$(last ProtectSystem)" = strict ] || fail "ProtectSystem= is not strict"
[ "$(last NoNewPrivileges)" = yes ] || fail "NoNewPrivileges= is not yes"
[ "$(last LimitNOFILE)" = 65536 ] || fail "LimitNOFILE= is not 65536"
# Reads with each job's user's rights: exactly CAP_SETUID and CAP_SETGID, nothing else.
[ "$(last AmbientCapabilities)" = "CAP_SETUID CAP_SETGID" ] || fail "AmbientCapabilities= is not exactly CAP_SETUID CAP_SETGID"
[ "$(last CapabilityBoundingSet)" = "CAP_SETUID CAP_SETGID" ] || fail "CapabilityBoundingSet= is not exactly CAP_SETUID CAP_SETGID"
# The shard cache (config/spdld.yaml cache_dir: /var/cache/spdld/shards) is writable, and only spdld's.
[ "$(last CacheDirectory)" = spdld ] || fail "CacheDirectory= is not spdld (the shard cache under ProtectSystem=strict)"
[ "$(last CacheDirectoryMode)" = 0700 ] || fail "CacheDirectoryMode= is not 0700"
[ "$(last LimitMEMLOCK)" = infinity ] || fail "LimitMEMLOCK= is not infinity (page-locked slots for GPU copies)"

# The shipped drop-in that pins egress to named ranges is a valid drop-in of the unit.
mkdir -p "$tmp/spdld.service.d"
cp "$src_dir/systemd/spdld-network.conf" "$tmp/spdld.service.d/network.conf"
grep -q "^IPAddressDeny=any" "$tmp/spdld.service.d/network.conf" || fail "spdld-network.conf does not deny by default"
out=$(systemd-analyze verify "$tmp/spdld.socket" "$tmp/spdld.service" 2>&1) || { echo "$out"; fail "verify with the network drop-in"; }
if echo "$out" | grep -qE "spdld\.(service|socket)|network\.conf"; then echo "$out"; fail "warnings with the network drop-in"; fi

# The exposure score README.md reports.
if score=$(systemd-analyze security --offline=yes "$tmp/spdld.service" 2>/dev/null | grep -o "Overall exposure level for spdld.service: [0-9.]* [A-Z]*"); then
  echo "$score"
  level=$(echo "$score" | awk '{print $(NF-1)}')
  awk -v l="$level" 'BEGIN { exit !(l <= 3.0) }' || fail "exposure level $level is above 3.0"
fi
echo "OK: systemd-analyze verify passes (spdld.service, spdld.socket, the network drop-in); the unit's rules hold"
