#!/usr/bin/env bash
# `zero3 train` across two "nodes" (docs/comm.md "Launchers"): two network namespaces joined by a veth
# pair, each with a host name of its own (a UTS namespace), mpirun in the first reaching the second through
# an rsh agent that runs the command in that namespace, as ssh would on another host. TCP between the
# nodes, as between hosts; the progress store listens on the first node's veth address (ZERO3_PROGRESS_ADDR,
# or without it the one interface rank 0's node has). Checks:
#   1. 2 ranks (one per node) and 4 ranks (two per node): the final checkpoint equals that of the same
#      number of ranks on one node (plain mpirun on this host), bit for bit;
#   2. rank 1, on the second node, stops itself (SIGSTOP) at step 3: the job ends non-zero within
#      zero3.comm.timeout_s + 30 s with a report naming rank 1 as the missing one.
# Usage: netns_test.sh ZERO3_BINARY CONFIGS_DIR MPIEXEC [MPIEXEC_FLAGS...]
# Exit 77 (skipped) when not root or when the kernel refuses network namespaces.
set -u
source "$(dirname "$0")/../support/skip.sh"
[[ $# -ge 3 ]] || { echo "usage: $0 ZERO3_BINARY CONFIGS_DIR MPIEXEC [MPIEXEC_FLAGS...]" >&2; exit 2; }
[[ "$(id -u)" -eq 0 ]] || skip "network namespaces need root"
zero3="$(realpath "$1")"
configs="$(realpath "$2")"
mpiexec="$(command -v "$3")"
shift 3
mpi_flags=("$@")
here="$(cd "$(dirname "$0")/../mpi" && pwd)"  # ckpt_tensors.py
timeout_s=10
bound=$((timeout_s + 30))

tmp="$(mktemp -d)"
ns=(zero3-a-$$ zero3-b-$$)
names=(node-a node-b)
addr=(10.77.0.1 10.77.0.2)
cleanup() {
  for n in "${ns[@]}"; do
    # Whatever still runs there (a rank of a failed case) goes with it.
    ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$n" 2>/dev/null  # takes its end of the veth pair, and so the pair, along
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
source "$(dirname "$0")/../support/checks.sh"
t_start=$(date +%s)

# ---------------------------------------------------------------- the two nodes
ip netns add "${ns[0]}" 2>"$tmp/netns.err" || skip "the kernel refuses network namespaces: $(cat "$tmp/netns.err")"
ip netns add "${ns[1]}" || { echo "FAIL: ip netns add ${ns[1]}"; exit 1; }
ip link add "z3a$$" netns "${ns[0]}" type veth peer name "z3b$$" netns "${ns[1]}" ||
  { echo "FAIL: no veth pair between the namespaces"; exit 1; }
for i in 0 1; do
  dev="z3$([[ $i -eq 0 ]] && echo a || echo b)$$"
  ip -n "${ns[i]}" link set lo up &&
    ip -n "${ns[i]}" addr add "${addr[i]}/24" dev "$dev" &&
    ip -n "${ns[i]}" link set "$dev" up || { echo "FAIL: setting up ${ns[i]}"; exit 1; }
done
for i in 0 1; do  # the carrier comes up a moment after the link
  for _ in $(seq 1 50); do
    ip -n "${ns[i]}" -br link show | grep -q "^z3.* UP " && break
    sleep 0.1
  done
done

# What ssh does for mpirun, here into the namespace of the node: AGENT [OPTIONS] HOST COMMAND...
cat >"$tmp/agent" <<EOF
#!/bin/sh
while [ "\${1#-}" != "\$1" ]; do shift; done
case "\$1" in
  ${addr[0]}) ns=${ns[0]} name=${names[0]} ;;
  ${addr[1]}) ns=${ns[1]} name=${names[1]} ;;
  *) echo "agent: no node \$1" >&2; exit 255 ;;
esac
shift
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$name && \$*"
EOF
chmod +x "$tmp/agent"

python3 - "$configs/gpt-tiny-offload.json" "$tmp" "$timeout_s" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["train_micro_batch_size_per_gpu"] = 4  # 32 = 4 x 2 micro-batches x 4 ranks, 4 x 4 x 2, 4 x 8 x 1
json.dump(c, open(f"{sys.argv[2]}/job.json", "w"))
c["zero3"]["comm"] = {"timeout_s": float(sys.argv[3])}
json.dump(c, open(f"{sys.argv[2]}/fault.json", "w"))
PY
train=("$zero3" train --progress off --log-interval 10)
cd "$tmp" || exit 1

# across NAME NP HOSTS [ENV=VALUE...] -- ARGS...: mpirun on node a, in the background ($job)
across() {
  local name="$1" np="$2" hosts="$3"
  shift 3
  local env=()
  while [[ "$1" != -- ]]; do env+=(-x "$1"); shift; done
  shift
  ip netns exec "${ns[0]}" unshare --uts sh -c 'hostname "$0" && exec "$@"' "${names[0]}" \
    "$mpiexec" "${mpi_flags[@]}" -np "$np" --host "$hosts" --mca plm_rsh_agent "$tmp/agent" \
    --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24 \
    "${env[@]}" "${train[@]}" "$@" >"$tmp/$name.out" 2>&1 &
  job=$!
}

# ---------------------------------------------------------------- 1. the same run on one node and on two
# 2 ranks with ZERO3_PROGRESS_ADDR; 4 without, where rank 0 picks its node's one non-loopback interface.
for layout in "2 ${addr[0]}:1,${addr[1]}:1 ZERO3_PROGRESS_ADDR=${addr[0]}" "4 ${addr[0]}:2,${addr[1]}:2 -"; do
  read -r np hosts progress <<<"$layout"
  t0=$(date +%s)
  timeout 120 "$mpiexec" "${mpi_flags[@]}" -np "$np" "${train[@]}" --config "$tmp/job.json" --steps 20 \
    --save-dir "$tmp/one$np" >"$tmp/one$np.out" 2>&1 || { fail "$np ranks on one node: exit $?: $(tail -n 5 "$tmp/one$np.out")"; continue; }
  if [[ "$progress" == - ]]; then
    across "two$np" "$np" "$hosts" -- --config "$tmp/job.json" --steps 20 --save-dir "$tmp/two$np"
  else
    across "two$np" "$np" "$hosts" "$progress" -- --config "$tmp/job.json" --steps 20 --save-dir "$tmp/two$np"
  fi
  wait "$job" || { fail "$np ranks on two nodes: exit $?: $(tail -n 8 "$tmp/two$np.out")"; continue; }
  grep -q "^zero3 train: .* $np ranks on" "$tmp/two$np.out" || fail "$np ranks on two nodes: no start line"
  grep -q "job: $np rank(s) on 2 node(s), $((np / 2)) on this node (.*); world from mpirun" "$tmp/two$np.out" ||
    fail "$np ranks on two nodes: the job's shape is not $np ranks on 2 nodes from mpirun: $(grep 'job:' "$tmp/two$np.out")"
  [[ "$progress" != - ]] || grep -q "progress server: listening on ${addr[0]} (interface z3a$$" "$tmp/two$np.out" ||
    fail "$np ranks on two nodes: the progress store is not on ${addr[0]}: $(grep 'progress' "$tmp/two$np.out")"
  if python3 "$here/ckpt_tensors.py" same "$tmp/one$np/global_step20" "$tmp/two$np/global_step20" \
    >"$tmp/same$np.txt" 2>&1; then
    echo "$np ranks on two nodes ($hosts): final checkpoint bitwise equal to one node's ($(($(date +%s) - t0)) s for both)"
  else
    fail "$np ranks on two nodes: the checkpoint differs from one node's: $(tail -n 3 "$tmp/same$np.txt")"
  fi
done

# ---------------------------------------------------------------- 2. a stopped rank on the second node
t0=$(date +%s.%N)
across stall 2 "${addr[0]}:1,${addr[1]}:1" ZERO3_PROGRESS_ADDR="${addr[0]}" ZERO3_FAULT=stall:rank=1:step=3 -- \
  --config "$tmp/fault.json" --steps 12
for _ in $(seq 1 $(((bound + 30) * 10))); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then
  fail "stall: the job still runs after $((bound + 30)) s"
  ip netns pids "${ns[0]}" | xargs -r kill -9
fi
wait "$job"
rc=$?
elapsed=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
[[ $rc -ne 0 ]] || fail "stall: the job exited 0"
python3 -c "import sys; sys.exit(0 if $elapsed <= $bound else 1)" || fail "stall: took $elapsed s, more than $bound s"
for p in "did not complete within $timeout_s s" "missing: rank 1"; do
  grep -q -- "$p" "$tmp/stall.out" || fail "stall: the report lacks '$p': $(grep error "$tmp/stall.out" | head -n 3)"
done
grep -q "^done:" "$tmp/stall.out" && fail "stall: a rank printed done"
echo "stall of rank 1 on node b: exit $rc after $elapsed s, the report names rank 1"

echo "netns: $(($(date +%s) - t_start)) s"
finish "two-node launch: all checks passed"
