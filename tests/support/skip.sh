# Skipping a shell test that cannot run here (a missing tool or Python package): `skip REASON` prints one
# line "SKIPPED: REASON" on stderr and exits 77, which ctest reports as skipped. Sourced by the test:
#   source "$(dirname "$0")/../support/skip.sh"
skip() {
  echo "SKIPPED: $*" >&2
  exit 77
}
