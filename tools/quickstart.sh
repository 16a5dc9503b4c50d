#!/usr/bin/env bash
# Installs the dependencies, builds the zero3 program (nothing else) and runs the main job over 2 local
# ranks. The main job: a tiny GPT trained with ZeRO-3 + CPU offload of the optimizer (bf16) over 2 local
# ranks on synthetic Markov data, until its held-out loss is within 0.1 nats/token of the data's entropy
# floor. CUDA code is compiled only where a GPU is present (preset default, build/); elsewhere the host
# backend alone (preset host, build-host/). tools/test.sh builds and tests everything.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
preset=host
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then preset=default; fi
build_dir=build-host
[ "$preset" = default ] && build_dir=build
echo "== build ($preset preset: $build_dir/bin/zero3 only)"
cmake --preset "$preset" -DZERO3_BUILD_TESTS=OFF >/dev/null
cmake --build --preset "$preset" --target zero3
zero3="$build_dir/bin/zero3"
mpi_flags=(--oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
[ "$(id -u)" -eq 0 ] && mpi_flags+=(--allow-run-as-root)
echo "== zero3 config check configs/zero3-offload-optimizer.json --world-size 2"
"$zero3" config check configs/zero3-offload-optimizer.json --world-size 2 >/dev/null && echo "config OK"
# Under mpirun a rank cannot tell whether the output ends up on a terminal; this script can.
progress=off
[ -t 1 ] && progress=on
echo "== mpirun -np 2 zero3 train --config configs/gpt-tiny-offload.json"
mpirun "${mpi_flags[@]}" -np 2 "$zero3" train --config configs/gpt-tiny-offload.json --progress "$progress"
