#!/usr/bin/env bash
# The scope-memory guard (ZERO3_GUARD_SCOPE_MEMORY=1, docs/device.md) on a real engine at 1 and 2 ranks
# (tests/mpi/scope_guard_probe.cpp): a host-thread read of GatherScope::param memory and a host-thread write
# of GradScope::grad memory abort every rank with the guard's message; without the guard the same reads go
# unnoticed; training through compute_stream().launch_host prints the same losses and params with the
# guard as without it.
# usage: scope_guard_test.sh PROBE MPIEXEC [MPIEXEC_FLAGS...]
set -u
probe=$1
shift
mpiexec=("$@")
message="zero3: the host thread touched device memory of the host backend outside stream work"
source "$(dirname "$0")/../support/checks.sh"

for np in 1 2; do
  for mode in touch-param touch-grad; do
    out=$(ZERO3_GUARD_SCOPE_MEMORY=1 "${mpiexec[@]}" -np "$np" "$probe" "$mode" 2>&1)
    rc=$?
    [ "$rc" -ne 0 ] || fail "np $np $mode under the guard exited 0"
    count=$(grep -c "$message" <<<"$out")
    [ "$count" -eq "$np" ] || fail "np $np $mode: the guard's message on $count of $np ranks"
    grep -q "enqueue host compute with Stream::launch_host; see docs/engine.md" <<<"$out" ||
      fail "np $np $mode: no fix in the message"
    grep -q survived <<<"$out" && fail "np $np $mode: the access went on under the guard"
    [ "$failures" -eq 0 ] || echo "$out"
  done
  out=$("${mpiexec[@]}" -np "$np" "$probe" touch-param 2>&1)
  rc=$?
  { [ "$rc" -eq 0 ] && grep -q survived <<<"$out"; } || fail "np $np touch-param without the guard: rc $rc: $out"

  plain=$("${mpiexec[@]}" -np "$np" "$probe" train 2>/dev/null)
  rc_plain=$?
  guarded=$(ZERO3_GUARD_SCOPE_MEMORY=1 "${mpiexec[@]}" -np "$np" "$probe" train 2>/dev/null)
  rc_guarded=$?
  [ "$rc_plain" -eq 0 ] && [ "$rc_guarded" -eq 0 ] || fail "np $np train: rc $rc_plain (plain), $rc_guarded (guarded)"
  grep -q "^step 2: loss" <<<"$plain" || fail "np $np train printed no losses: $plain"
  [ "$plain" == "$guarded" ] || fail "np $np train differs under the guard:
--- plain
$plain
--- guarded
$guarded"
  echo "np $np: guard stops host-thread access to scope memory; training under it is unchanged"
done
finish "scope-memory guard: all checks passed"
