#!/usr/bin/env bash
# Installs the dependencies, builds zero3 and runs the main job over 2 local ranks.
# The main job: a tiny GPT trained with ZeRO-3 + CPU offload of the optimizer (bf16) over 2 local ranks on
# synthetic Markov data, until its held-out loss is within 0.1 nats/token of the data's entropy floor.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default
mpi_flags=(--oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
[ "$(id -u)" -eq 0 ] && mpi_flags+=(--allow-run-as-root)
echo "== zero3 config check configs/zero3-offload-optimizer.json --world-size 2"
build/bin/zero3 config check configs/zero3-offload-optimizer.json --world-size 2 >/dev/null && echo "config OK"
# Under mpirun a rank cannot tell whether the output ends up on a terminal; this script can.
progress=off
[ -t 1 ] && progress=on
echo "== mpirun -np 2 zero3 train --config configs/gpt-tiny-offload.json"
mpirun "${mpi_flags[@]}" -np 2 build/bin/zero3 train --config configs/gpt-tiny-offload.json --progress "$progress"
