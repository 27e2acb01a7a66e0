#!/usr/bin/env bash
# Checks the honest skips (tests/skip.h) with tests/unit/skip_test.cc's hidden cases: a skipped case
# exits 77 (ctest: Skipped) and says why; a failure before a skip still fails; a pass exits 0.
set -uo pipefail
bin=$1
shift
strict=("$@")  # Catch2's "fail when the name matches nothing" option (v2: --warn NoTests, v3: --warn UnmatchedTestSpec)
[ ${#strict[@]} -gt 0 ] || strict=(--warn NoTests)
fail() { echo "FAIL: $*"; exit 1; }
out=$("$bin" "${strict[@]}" "skip: a case that skips" 2>&1); rc=$?
[ $rc -eq 77 ] || fail "a skipped case exited $rc, not 77: $out"
grep -q "SKIPPED: skip: a case that skips: this machine lacks the thing" <<<"$out" || fail "no reason printed: $out"
out=$("$bin" "${strict[@]}" "skip: a case that skips a part and passes the rest" 2>&1); rc=$?
[ $rc -eq 77 ] || fail "a partly skipped case exited $rc, not 77: $out"
out=$("$bin" "${strict[@]}" "skip: a case that fails then skips" 2>&1); rc=$?
[ $rc -ne 0 ] && [ $rc -ne 77 ] || fail "a failure followed by a skip exited $rc (must fail): $out"
out=$("$bin" "${strict[@]}" "skip: a case that passes" 2>&1); rc=$?
[ $rc -eq 0 ] || fail "a passing case exited $rc: $out"
echo "ok: skip 77 with its reason, failure wins over skip, pass 0"
