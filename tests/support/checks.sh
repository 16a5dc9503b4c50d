# Check counting for the shell tests, sourced after their set-up:
#   source "$(dirname "$0")/../support/checks.sh"
#   fail "MESSAGE"     prints "FAIL: MESSAGE" and counts it; the test goes on to its other checks
#   finish "SUMMARY"   ends the test: status 1 with the count of failures, else status 0 after SUMMARY
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
finish() {
  if [[ $failures -ne 0 ]]; then
    echo "$failures failure(s)"
    exit 1
  fi
  echo "$*"
  exit 0
}
