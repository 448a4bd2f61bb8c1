#!/usr/bin/env bash
# check_reconfigure.sh - a test goal configures again when config.mk was
# written without Check or libcurl.
#
# On a fresh Debian, `make run` installs the build packages and configures
# (HAVE_CHECK = no); `make check` then installs Check and libcurl through
# `deps`, and every test binary failed to link, because config.mk depended
# only on configure and config.mk.in and was never written again.  Here, in
# a copy of the tree:
#   - configure runs with Check hidden from pkg-config (PKG_CONFIG_LIBDIR
#     holding every .pc file but check.pc), as `make run` would leave it;
#   - `make -n unit` (pkg-config as usual) must configure again: config.mk
#     then says HAVE_CHECK = yes;
#   - with Check still hidden, `make -n unit` must stop at once with a line
#     naming Check, not go on to link errors (nor configure in a loop).
# Nothing is installed or removed: apt-get is a stub that fails, in case a
# package `deps` wants is missing on this machine.
# One line per check, then "N passed, M failed"; exits 1 if M > 0.
#
# Environment: RATELIMITD_SRCDIR (the repository root), as `make
# integration` sets it.
set -euo pipefail

: "${RATELIMITD_SRCDIR:?set RATELIMITD_SRCDIR to the repository root}"
src=$RATELIMITD_SRCDIR
unset MAKEFLAGS MAKELEVEL MFLAGS MAKEOVERRIDES SANITIZER BUILD
tmp=$(mktemp -d "${TMPDIR:-/tmp}/rl-reconf-XXXXXX")
trap 'rm -rf "$tmp"' EXIT

. "$src/tests/platform/lib/check.sh"

tree=$tmp/tree
hidden=$tmp/pc-without-check
mkdir -p "$tree" "$hidden" "$tmp/bin"
# The tree as it is now (tracked and new files), without its build.
(cd "$src" && git ls-files -co --exclude-standard -z |
  xargs -0 tar -cf - --no-recursion) | tar -C "$tree" -xf -
rm -f "$tree/config.mk" "$tree/configure"
printf '#!/bin/sh\necho "apt-get stub: $*" >&2\nexit 1\n' >"$tmp/bin/apt-get"
chmod +x "$tmp/bin/apt-get"
export PATH=$tmp/bin:$PATH

IFS=: read -r -a pc_dirs <<<"$(pkg-config --variable pc_path pkg-config)"
for d in "${pc_dirs[@]}"; do
  [ -d "$d" ] || continue
  for pc in "$d"/*.pc; do
    [ -e "$pc" ] || continue
    case ${pc##*/} in check.pc) continue ;; esac
    [ -e "$hidden/${pc##*/}" ] || ln -s "$pc" "$hidden/${pc##*/}"
  done
done

configured_without_check() {
  (cd "$tree" && autoreconf -fi >/dev/null 2>&1 &&
    PKG_CONFIG_LIBDIR=$hidden ./configure --quiet) || return 1
  grep -q '^HAVE_CHECK = no' "$tree/config.mk" || {
    echo "config.mk: $(grep '^HAVE_CHECK' "$tree/config.mk")"
    return 1
  }
}

still_hidden_stops() {
  local out rc=0
  out=$(cd "$tree" && PKG_CONFIG_LIBDIR=$hidden timeout 300 make -n unit 2>&1) ||
    rc=$?
  if [ "$rc" -eq 0 ] || ! grep -q 'the tests need Check' <<<"$out"; then
    echo "make -n unit, exit $rc:"
    tail -5 <<<"$out"
    return 1
  fi
}

test_goal_reconfigures() {
  local out rc=0
  out=$(cd "$tree" && timeout 300 make -n unit 2>&1) || rc=$?
  if [ "$rc" -ne 0 ] || ! grep -q '^HAVE_CHECK = yes' "$tree/config.mk"; then
    echo "make -n unit, exit $rc; config.mk: $(grep '^HAVE_CHECK' \
      "$tree/config.mk")"
    tail -5 <<<"$out"
    return 1
  fi
}

check "configure with Check hidden writes HAVE_CHECK = no" \
  configured_without_check
check "a test goal with Check still missing stops with a clear line" \
  still_hidden_stops
check "a test goal configures again once Check is there" \
  test_goal_reconfigures

check_done
