#!/usr/bin/env bash
# Installs every build and test dependency of zero3 from Debian packages.
# Idempotent: when every package is already present it returns in well under a second without apt.
set -euo pipefail

packages=(
  build-essential cmake ninja-build clang-format clang-tidy
  clang libclang-rt-dev  # tools/fuzz.sh: libFuzzer and the sanitizer runtimes (recommended only, by clang)
  libtbb-dev nlohmann-json3-dev catch2 libhwloc-dev
  libopenmpi-dev openmpi-bin
  libcli11-dev libfmt-dev libxxhash-dev libopenblas-dev
  libdnnl-dev  # runtime/models: bf16 (and fp32) matrix products of the host models (optional: ZERO3_WITH_ONEDNN)
  liburing-dev  # offload/aio.cpp: io_uring for the NVMe offload's direct file I/O
  gnuplot-nox  # zero3 mem report: the PNG plots of a profiled run
  slurm-wlm slurm-wlm-basic-plugins munge  # tests/launchers/slurm_test.sh: a one-node cluster; srun --mpi=pmix
  iproute2  # tests/launchers/netns_test.sh: two "nodes" as network namespaces
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
