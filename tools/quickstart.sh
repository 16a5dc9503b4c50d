#!/usr/bin/env bash
# Installs the dependencies, builds zero3 and runs the main job over 2 local ranks.
# (Until the GPT trainer lands, the main job is the transformer test model trained with ZeRO-3 + CPU
# offload next to the same run on the device, plus the sharded-collectives demo and a config check.)
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default
mpi_flags=(--oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
[ "$(id -u)" -eq 0 ] && mpi_flags+=(--allow-run-as-root)
echo "== zero3 config check configs/zero3-offload-optimizer.json --world-size 2"
build/bin/zero3 config check configs/zero3-offload-optimizer.json --world-size 2 >/dev/null && echo "config OK"
echo "== mpirun -np 2 zero3 demo"
mpirun "${mpi_flags[@]}" -np 2 build/bin/zero3 demo
echo "== mpirun -np 2 zero3 bench offload (ZeRO-3 + CPU offload of optimizer and params)"
mpirun "${mpi_flags[@]}" -np 2 build/bin/zero3 bench offload --offload-param --repeats 2 --steps 2 --d-model 128 --layers 2
