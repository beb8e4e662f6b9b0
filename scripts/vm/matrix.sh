#!/usr/bin/env bash
# The kernel matrix (npm run test:kernels): Debian's own kernels booted under
# qemu on this machine's root filesystem, each running the kernel tests that
# define svctrace's core path.
#
#   row             kernel (suite)              backend    tests  why
#   6.12:faults     6.12 (bookworm-backports)   netfilter  the fault catalogue's IPVS column (the host has no IPVS)
#   6.12:netfilter  6.12                        netfilter  kernel the default where links exist (its full list runs on the host)
#   6.1:fentry      6.1 (bookworm)              fentry     full   no netfilter links (< 6.4): the managed-node case
#   6.1:kprobe      6.1                         kprobe     core   the fallback, on a kernel where fentry is the default
#   6.12:fentry     6.12                        fentry     core   a second backend on one kernel
#   5.10:kprobe     5.10 (bullseye)             kprobe     full   no netfilter links, no module BTF, no drop reasons (Amazon Linux 2's kernel line)
# "full" is every kernel test of the list below, in the backend `auto` picks
# on that kernel (SVT_EXPECT_BACKEND asserts the pick), and it includes the
# test comparing all the backends the kernel offers side by side on the same
# traffic (6.12: all three). Each backend thus runs the full list on one
# kernel; on its second kernel it runs the core path (flows, exact counters,
# bounded events, backpressure, IPVS), not the whole list again.
# The host's own kernel runs the whole suite (npm test) with auto, which is
# netfilter: netfilter's second kernel, 6.12, runs "kernel": the core path
# plus the tests that depend on the kernel itself (doctor against its
# config, the three backends side by side). The CLI-level tests (trace
# output, several processes, batching) exercise the same netfilter programs
# the host runs them on; repeating them there cost about 7 minutes of CI's
# 90 on the critical lane.
#
# The fault catalogue's guest mostly waits out observation windows (about
# one core of this machine's two, on average), the other rows keep a guest's
# two vCPUs busy: the catalogue runs in a lane of its own beside the other
# rows in turn (SVT_VM_LANES=1: every row one after another). Two busy
# guests side by side gain nothing: each ran at half speed. Every guest's
# waits are scaled (SVT_TEST_TIME_SCALE, set by boot.sh under TCG).
#
# SVT_VM_ROWS="6.1:fentry 6.12:netfilter" picks rows; SVT_VM_TESTS (space-
# separated dist/test paths) replaces every row's test list. Streams each
# row's test lines (prefixed with the row when lanes run side by side),
# prints why a row failed, a line per row, and a closing "N passed, N failed"
# line; exits non-zero when any row failed.
set -euo pipefail
cd "$(dirname "$0")/../.."

CORE_TESTS="dist/test/kernel/core-tracer.test.js dist/test/kernel/data-plane.test.js dist/test/kernel/ipvs.test.js"
KERNEL_TESTS="dist/test/kernel/doctor.test.js dist/test/kernel/backends.test.js $CORE_TESTS"
FULL_TESTS="dist/test/kernel/doctor.test.js dist/test/kernel/backends.test.js dist/test/kernel/first-trace.test.js $CORE_TESTS dist/test/kernel/trace-cli.test.js dist/test/kernel/concurrent.test.js dist/test/kernel/batching.test.js"
ROWS=${SVT_VM_ROWS:-"6.12:faults 6.12:netfilter 6.1:fentry 6.1:kprobe 6.12:fentry 5.10:kprobe"}
LANES=${SVT_VM_LANES:-2}
# Each row boots in a few seconds; its tests take minutes under TCG. The
# limit is a guard against a hung guest, not a deadline: the slowest row
# (6.1:fentry) took 1160 s beside the catalogue's guest, and 1500 left it
# too little room on a slower machine.
ROW_TIMEOUT=${SVT_VM_ROW_TIMEOUT:-2400}

declare -A release_of
while read -r suite release _dir; do
  case $suite in
    bookworm) release_of[6.1]=$release ;;
    bookworm-backports) release_of[6.12]=$release ;;
    bullseye-security) release_of[5.10]=$release ;;
  esac
done < <(bash scripts/vm/kernels.sh bookworm bookworm-backports bullseye-security)

for row in $ROWS; do
  if [ -z "${release_of[${row%%:*}]:-}" ]; then
    echo "vm-matrix: unknown kernel '${row%%:*}' in row '$row' (known: ${!release_of[*]})" >&2
    exit 2
  fi
done

logdir=test-output/vm
mkdir -p "$logdir"
# Per row, written when it ends: its summary line, its pass/fail counts, why it failed.
state=$(mktemp -d /tmp/svt-vm-matrix.XXXXXX)
lane_pids=()
cleanup() {
  for p in "${lane_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$state"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# run_row ROW PREFIX: boots the row's kernel, runs its tests, records its result in $state.
run_row() {
  local row=$1 prefix=$2
  local kernel=${row%%:*} kind=${row#*:}
  local release=${release_of[$kernel]}
  local log=$logdir/$release-$kind.log
  local start require expect backend tests what timeout died_once= rc attempt
  # The backends each kernel must offer (compared side by side), and the one
  # auto must pick there.
  case $kernel in
    6.12) require="netfilter fentry kprobe" expect=netfilter ;;
    6.1) require="fentry kprobe" expect=fentry ;;
    5.10) require="kprobe" expect=kprobe ;;
    *) require= expect= ;;
  esac
  backend=$kind timeout=$ROW_TIMEOUT
  if [ "$kind" = faults ]; then
    # The fault catalogue's IPVS column, in the kernel's own backend: about
    # 80 s a fault under TCG.
    backend=$expect tests=dist/test/kernel/fault-catalogue.test.js timeout=$((ROW_TIMEOUT + 1500)) what="the fault catalogue's IPVS column"
  elif [ "$backend" = netfilter ]; then tests=$KERNEL_TESTS what="the core path and the kernel's own tests (the full list runs on the host)"
  elif [ "$backend" = "$expect" ]; then tests=$FULL_TESTS what="the full list"
  else tests=$CORE_TESTS what="the core path"
  fi
  if [ -n "${SVT_VM_TESTS:-}" ]; then tests=$SVT_VM_TESTS what="SVT_VM_TESTS"; fi
  echo "${prefix}=== vm-matrix: Linux $release, backend $backend, $what (log: $log)"
  start=$(date +%s)
  for attempt in 1 2; do
    # Debian's kernels have IPVS: the kube-proxy IPVS mode test must run.
    # shellcheck disable=SC2086
    ( SVT_FAULT_MODES=ipvs SVT_REQUIRE_IPVS=1 SVT_REQUIRE_BACKENDS="$require" SVT_EXPECT_BACKEND=$expect SVCTRACE_BACKEND=$backend CI=true bash scripts/vm/boot.sh "$release" --timeout "$timeout" -- \
        node --test --test-concurrency=1 --test-reporter=spec $tests 2>&1
      echo "vm-exit $?" ) | tee "$log" | grep -E --line-buffered '^(guest:|vm-boot:|▶|✔|✖|  ✔|  ✖|ℹ (pass|fail))' | sed -u "s/^/$prefix/" || true
    rc=$(awk '/^vm-exit /{ print $2 }' "$log" | tail -n1)
    # A guest kernel that died (an Oops or panic: seen once, an int3 Oops in
    # __netif_receive_skb_core while a tracepoint was being patched under
    # multi-threaded TCG) never reports the tests' exit code. The row runs
    # once more, and says so; a second death fails it.
    if [ "$attempt" = 1 ] && [ "$rc" != 0 ] && grep -qE 'Kernel panic|Oops:' "$log" && grep -q "ended without the command's exit code" "$log"; then
      died_once=$(grep -m1 -E 'Oops:|Kernel panic' "$log" | sed 's/^\[ *[0-9.]*\] //')
      mv "$log" "$log.died"
      echo "${prefix}vm-matrix: the guest kernel died ($died_once; log: $log.died); running the row once more"
      continue
    fi
    break
  done
  local took=$(( $(date +%s) - start ))
  local pass fail line
  pass=$(grep -E '^ℹ pass ' "$log" | tail -n1 | awk '{print $3}' | tr -d '\r' || true)
  fail=$(grep -E '^ℹ fail ' "$log" | tail -n1 | awk '{print $3}' | tr -d '\r' || true)
  line=$(printf '%-28s %-10s %s pass, %s fail, %ss' "$release" "$kind" "${pass:-?}" "${fail:-?}" "$took")
  if [ -n "$died_once" ]; then line="$line  (guest kernel died on the first run: $died_once)"; fi
  if [ "$rc" != 0 ]; then
    line="$line  FAILED (exit $rc)"
    # The streamed lines show which test failed, not why: the reporter's own
    # account of each failure (assertion, values) is at the end of the log,
    # which a CI machine does not keep.
    { echo "=== vm-matrix: why $release $kind failed (end of $log)"
      sed -n '/^✖ failing tests:/,$p' "$log" | head -n 150 || true
    } > "$state/$row.why"
  fi
  echo "$line" > "$state/$row.line"
  echo "${pass:-0} ${fail:-0} $rc" > "$state/$row.counts"
}

# run_lane ROW...: the rows one after another.
run_lane() {
  local row prefix=
  for row in "$@"; do
    [ "$LANES" = 1 ] || prefix="[$row] "
    run_row "$row" "$prefix"
  done
}

if [ "$LANES" = 1 ]; then
  run_lane $ROWS
else
  # Lane one: the fault catalogue's row, or the first row; lane two: the others.
  first=
  for row in $ROWS; do
    if [ "${row#*:}" = faults ]; then first=$row; fi
  done
  [ -n "$first" ] || first=${ROWS%% *}
  rest=()
  for row in $ROWS; do
    if [ "$row" != "$first" ]; then rest+=("$row"); fi
  done
  run_lane "$first" &
  lane_pids+=($!)
  if [ ${#rest[@]} -gt 0 ]; then
    run_lane "${rest[@]}" &
    lane_pids+=($!)
  fi
  for p in "${lane_pids[@]}"; do wait "$p" || true; done
  lane_pids=()
fi

failed=0 passed_total=0 failed_total=0
for row in $ROWS; do
  if [ -f "$state/$row.why" ]; then cat "$state/$row.why"; fi
done
echo "=== vm-matrix summary"
for row in $ROWS; do
  if [ -f "$state/$row.line" ]; then
    echo "  $(cat "$state/$row.line")"
    read -r p f rc < "$state/$row.counts"
    passed_total=$((passed_total + p)) failed_total=$((failed_total + f))
    [ "$rc" = 0 ] || failed=1
  else
    echo "  $row: did not finish"
    failed=1
  fi
done
# A row that failed without a failing test (a guest that died or timed out) still fails the matrix.
[ "$failed" = 0 ] || [ "$failed_total" -gt 0 ] || failed_total=1
echo "vm-matrix: $passed_total passed, $failed_total failed"
exit $failed
