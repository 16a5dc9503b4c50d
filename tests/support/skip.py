"""Skipping a Python test that cannot run here (a missing package): skip(reason) prints one line
"SKIPPED: <reason>" on stderr and exits 77, which ctest reports as skipped. A test in tests/<area>/ imports it
with sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support")), after
sys.dont_write_bytecode = True so that no __pycache__ lands in the source tree."""
import sys

SKIP_EXIT_CODE = 77


def skip(reason):
    sys.stdout.flush()
    print(f"SKIPPED: {reason}", file=sys.stderr, flush=True)
    sys.exit(SKIP_EXIT_CODE)
