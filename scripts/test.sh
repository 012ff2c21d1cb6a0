#!/usr/bin/env bash
# The whole suite in two lanes, the way CI runs it (README's test command):
#   1. every test not marked `alone`, on every core (pytest-xdist; a module's tests stay on one
#      worker, so its module fixtures start once);
#   2. the tests marked `alone` (whole-machine clusters, SIGKILL timing, vLLM), one at a time.
# Both lanes always run; the exit status is non-zero if either failed. Extra arguments go to both
# lanes (`bash scripts/test.sh tests/remote -x`). HALLULOG_TEST_WORKERS sets lane 1's workers
# (default: auto = one per core).
set -uo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
workers=${HALLULOG_TEST_WORKERS:-auto}

lane() {  # lane NAME PYTEST-ARGS...: runs pytest, records the lane's seconds and status
  local name=$1; shift
  local start=$SECONDS
  "$py" -m pytest "$@"
  local rc=$?
  # 5: no test collected (a path with no test of that lane) is not a failure
  [ $rc -eq 5 ] && rc=0
  times+=("$name: $((SECONDS - start)) s (exit $rc)")
  return $rc
}

times=()
lane "parallel lane (-n $workers)" -n "$workers" --dist loadscope -m "not alone" "$@"; rc_parallel=$?
lane "alone lane" -p no:xdist -m alone "$@"; rc_alone=$?
echo
for line in "${times[@]}"; do echo "$line"; done
[ $rc_parallel -eq 0 ] && [ $rc_alone -eq 0 ]
