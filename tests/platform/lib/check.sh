# check.sh - the runner the platform checks share (sourced, not run: it
# lives out of the tests/platform/*.sh that make runs).
#
# check NAME FUNCTION [ARGS...]: run FUNCTION, which prints why it fails
# and returns non-zero; a check may print "note: ..." lines when it passes.
# Prints "ok NAME" or "FAIL NAME" and FUNCTION's output indented, and
# counts it.  check_done prints "N passed, M failed" and fails if M > 0.

passed=0
failed=0

check() {
  local name=$1 out rc=0
  shift
  out=$("$@" 2>&1) || rc=$?
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
    printf 'ok   %s\n' "$name"
  else
    failed=$((failed + 1))
    printf 'FAIL %s\n' "$name"
  fi
  if [ -n "$out" ]; then
    printf '%s\n' "$out" | sed 's/^/     /'
  fi
  return 0
}

check_done() {
  printf '%d passed, %d failed\n' "$passed" "$failed"
  [ "$failed" -eq 0 ]
}
