#!/bin/sh
# valgrind.sh - run the daemon under valgrind memcheck, for `make valgrind`:
# the integration tests start this instead of the daemon (RATELIMITD_BIN).
# Any memory error, or a leak that is definitely lost, makes the daemon exit
# 99, which the tests see as a failed stop; valgrind's report goes to
# $VALGRIND_LOGS/vg.PID.log.
exec valgrind -q --error-exitcode=99 --leak-check=full \
	--errors-for-leak-kinds=definite --show-leak-kinds=definite \
	--log-file="${VALGRIND_LOGS:-/tmp}/vg.%p.log" \
	"${RATELIMITD_REAL_BIN:?}" "$@"
