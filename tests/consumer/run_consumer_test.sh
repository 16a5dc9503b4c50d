#!/usr/bin/env bash
# unit.consumer_find_package: installs a configured and built zero3 into a fresh prefix, then configures,
# builds and runs tests/consumer against that prefix alone, as a C++ trainer would.
#   tests/consumer/run_consumer_test.sh BUILD_DIR SOURCE_DIR
# The consumer uses the build's generator, C++ compiler and build type; when zero3 was built with CUDA the
# installed package finds CUDAToolkit itself (zero3Config.cmake).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)

cache_value() {  # cache_value NAME: the value of NAME in the build's CMakeCache.txt, or ""
  sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -n 1
}
generator=$(cache_value CMAKE_GENERATOR)
cxx=$(cache_value CMAKE_CXX_COMPILER)
build_type=$(cache_value CMAKE_BUILD_TYPE)

# Unique per run, inside the build tree; removed on success, kept for a look on failure.
work=$(mktemp -d "$build/consumer-test.XXXXXX")
prefix=$work/prefix
step() { echo "consumer: $*"; }

step "install $build -> $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; exit 1; }
for f in include/zero3/core/error.hpp include/zero3/core/version.hpp include/zero3/device/device.hpp bin/zero3; do
  [ -e "$prefix/$f" ] || { echo "consumer: $prefix/$f was not installed" >&2; exit 1; }
done
[ ! -e "$prefix/include/zero3/core/version.hpp.in" ] || { echo "consumer: a header template was installed" >&2; exit 1; }
# The benchmarks are a program of the build tree, not of the product.
[ ! -e "$prefix/bin/zero3-bench" ] || { echo "consumer: zero3-bench was installed" >&2; exit 1; }
config=$(find "$prefix" -path '*/cmake/zero3/zero3Config.cmake' | head -n 1)
[ -n "$config" ] || { echo "consumer: zero3Config.cmake was not installed" >&2; exit 1; }
"$prefix/bin/zero3" --help >/dev/null

step "configure $src/tests/consumer against $prefix"
# Only the install prefix is searched for zero3, never the build tree or the user package registry.
cmake -S "$src/tests/consumer" -B "$work/build" -G "$generator" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE="$build_type" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }

step "build"
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }

step "run"
"$work/build/zero3_consumer"
rm -rf "$work"
