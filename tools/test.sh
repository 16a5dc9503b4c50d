#!/usr/bin/env bash
# Installs the dependencies, builds, and runs every test (unit, MPI at world sizes 1-4; GPU tests are
# skipped without a device). `tools/test.sh tsan` runs the host-backend and communicator tests under
# ThreadSanitizer; `tools/test.sh asan` runs all tests under AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-default}
tools/install-deps.sh
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
ctest --preset "$preset"
