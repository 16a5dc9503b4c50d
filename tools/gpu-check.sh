#!/usr/bin/env bash
# The one prepared script for a lent GPU machine (one call: unpack, build for sm_90, run the GPU
# tests and benchmarks, print a short table).
#
#   tools/gpu-check.sh prepare   on a machine with Debian's package mirror: downloads the .deb files of
#                                zero3's dependencies into .deps-gpu/debs (git-ignored)
#   tools/gpu-check.sh run       on the GPU machine (nvcc, cmake, ninja; no network): unpacks the .debs
#                                into .deps-gpu/prefix with dpkg -x, builds, runs the `gpu`-labelled
#                                tests and the demo on the GPU, prints a table; logs go to $OUT if set
#
# The GPU machine has none of our Debian dependencies, so .deps-gpu travels with the call.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
deps=$root/.deps-gpu

# Headers and libraries needed to build and link, plus the runtime libraries Open MPI loads.
packages=(
  libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5 nlohmann-json3-dev catch2 libcli11-dev libfmt-dev libfmt9
  libxxhash-dev libxxhash0 libhwloc-dev libhwloc15 libnuma1 libltdl7 libpciaccess0 libudev1 liburing-dev liburing2
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libpmix2 libevent-core-2.1-7 libevent-pthreads-2.1-7
  libevent-2.1-7 libfabric1 libucx0 libibverbs1 librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200
  libnl-route-3-200 libmunge2
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0 libgfortran5
)

prepare() {
  mkdir -p "$deps/debs"
  (cd "$deps/debs" && apt-get download "${packages[@]}" >/dev/null)
  echo "gpu-check: $(ls "$deps/debs" | wc -l) packages, $(du -sh "$deps/debs" | cut -f1) in $deps/debs"
}

run() {
  local out=${OUT:-$root/build-gpu-out}
  mkdir -p "$out"
  local prefix=$deps/prefix
  if [ ! -d "$deps/debs" ]; then
    echo "gpu-check: $deps/debs is missing: run 'tools/gpu-check.sh prepare' first and carry .deps-gpu" >&2
    exit 2
  fi
  rm -rf "$prefix" && mkdir -p "$prefix"
  for f in "$deps"/debs/*.deb; do dpkg -x "$f" "$prefix"; done
  local multiarch=lib/x86_64-linux-gnu
  export OPAL_PREFIX=$prefix/usr  # Open MPI finds its components and help files relative to this
  export PATH=$prefix/usr/bin:$PATH
  export LD_LIBRARY_PATH=$prefix/usr/$multiarch:$prefix/usr/$multiarch/openmpi/lib:$prefix/usr/$multiarch/openblas-pthread:${LD_LIBRARY_PATH:-}
  local nproc_=$(nproc)
  local start=$(date +%s)
  cmake -S "$root" -B "$root/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DZERO3_WERROR=OFF \
    -DCMAKE_PREFIX_PATH="$prefix/usr;$prefix/usr/$multiarch/cmake" \
    -DMPI_CXX_COMPILER="$prefix/usr/bin/mpicxx.openmpi" -DMPIEXEC_EXECUTABLE="$prefix/usr/bin/mpirun.openmpi" \
    2>&1 | tee "$out/configure.log" | grep -E "zero3|Error|error" || true
  cmake --build "$root/build-gpu" -j "$nproc_" 2>&1 | tee "$out/build.log" | tail -n 3
  local built=$(date +%s)
  set +e
  ctest --test-dir "$root/build-gpu" -L gpu --output-on-failure 2>&1 | tee "$out/ctest-gpu.log" | tail -n 15
  local gpu_rc=${PIPESTATUS[0]}
  "$root/build-gpu/bin/zero3" info 2>&1 | tee "$out/info.log"
  "$root/build-gpu/bin/zero3" demo --device cuda --params 100000003 2>&1 | tee "$out/demo.log" | tail -n 20
  local demo_rc=${PIPESTATUS[0]}
  # zero3 train's GPT on the GPU: the tiny job must reach its entropy floor; then gpt-small's throughput
  # with and without CPU offload (one GPU: world size 1).
  "$root/build-gpu/bin/zero3" train --config "$root/configs/gpt-tiny-ondevice.json" --device cuda --progress off \
    --metrics "$out/train-cuda.jsonl" 2>&1 | tee "$out/train-cuda.log" | tail -n 4
  local train_rc=${PIPESTATUS[0]}
  "$root/build-gpu/bin/zero3-bench" train --config "$root/configs/gpt-small.json" --device cuda --world-sizes 1 \
    --steps 5 2>&1 | tee "$out/bench-train.md" | tail -n 4
  # The CPU optimizer on the GPU machine's host cores (the figure offload depends on there).
  "$root/build-gpu/bin/zero3-bench" cpu-optimizer --params 100M --json 2>&1 | tee "$out/cpu-optimizer.json" | tail -n 3
  set -e
  local done_=$(date +%s)
  {
    echo
    echo "| check | result |"
    echo "|---|---|"
    echo "| build (sm_90, $nproc_ jobs) | $((built - start)) s |"
    echo "| ctest -L gpu | $(grep -E 'tests passed|tests failed' "$out/ctest-gpu.log" | tail -n 1) (exit $gpu_rc) |"
    echo "| demo on cuda | $(grep -E '^check:' "$out/demo.log" | sed 's/|/;/g') (exit $demo_rc) |"
    echo "| train gpt-tiny on cuda | $(grep -E '^done:' "$out/train-cuda.log" | sed 's/|/;/g') (exit $train_rc) |"
    echo "| bench train gpt-small (cuda, ws 1) | $(grep -E '^\| 1 \|' "$out/bench-train.md" | awk -F'|' '{printf "%s: %s tokens/s; ", $3, $4}') |"
    echo "| cpu-optimizer 100M | $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"][0]; print("fused/bound %.3f, fused/unfused %.2f, %.2f Gparam/s, %d threads" % (r["fused_over_bound"], r["fused_over_unfused"], r["fused_gparams_per_s"], r["threads"]))' "$out/cpu-optimizer.json" 2>/dev/null || echo "not run") |"
    echo "| total | $((done_ - start)) s |"
  } | tee "$out/summary.md"
  [ "$gpu_rc" -eq 0 ] && [ "$demo_rc" -eq 0 ] && [ "$train_rc" -eq 0 ]
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: tools/gpu-check.sh prepare|run" >&2; exit 2 ;;
esac
