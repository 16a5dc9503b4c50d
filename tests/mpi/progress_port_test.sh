#!/usr/bin/env bash
# Two jobs given the same ZERO3_PROGRESS_PORT: the port is held (here by a listening socket, as the first
# job's progress store would hold it), and a 2-rank `zero3 train` must end on every rank with an error
# naming the progress store and the port, within seconds, instead of rank 1 waiting for an endpoint rank 0
# never sends. Then the same job on a free port trains and says where its store listens.
# Usage: progress_port_test.sh ZERO3_BINARY CONFIGS_DIR MPIEXEC [MPIEXEC_FLAGS...]
set -u
zero3="$(realpath "$1")"
configs="$(realpath "$2")"
mpiexec="$3"
shift 3
tmp="$(mktemp -d)"
holder=""
trap '[[ -n "$holder" ]] && kill "$holder" 2>/dev/null; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"

python3 - "$tmp/port" <<'PY' &
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1]))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
PY
holder=$!
for _ in $(seq 1 100); do [[ -s "$tmp/port" ]] && break; sleep 0.1; done
port="$(cat "$tmp/port")"

cd "$tmp" || exit 1
ZERO3_PROGRESS_PORT="$port" timeout 120 "$mpiexec" "$@" -x ZERO3_PROGRESS_PORT -np 2 "$zero3" train --progress off \
  --config "$configs/gpt-tiny-offload.json" --steps 3 --run-dir "$tmp/taken" >"$tmp/taken.out" 2>&1
code=$?
[[ $code -ne 124 ]] || fail "port taken: the job hung (killed after 120 s)"
[[ $code -ne 0 ]] || fail "port taken: exit 0"
grep -q "progress server: cannot listen on 127.0.0.1 port $port" "$tmp/taken.out" ||
  fail "port taken: no error naming the port: $(tail -n 5 "$tmp/taken.out")"
grep -q "rank 1.*the progress store of rank 0 did not start" "$tmp/taken.out" ||
  fail "port taken: rank 1 does not name the failure: $(tail -n 5 "$tmp/taken.out")"
echo "port $port taken: exit $code; $(grep -c "cannot listen" "$tmp/taken.out") line(s) name it"

timeout 120 "$mpiexec" "$@" -np 2 "$zero3" train --progress off --config "$configs/gpt-tiny-offload.json" --steps 3 \
  --run-dir "$tmp/free" >"$tmp/free.out" 2>&1 || fail "free port: $(tail -n 5 "$tmp/free.out")"
grep -q "progress store: listening on 127.0.0.1:[0-9]" "$tmp/free.out" ||
  fail "free port: no line saying where the progress store listens"

finish "progress port: all checks passed"
