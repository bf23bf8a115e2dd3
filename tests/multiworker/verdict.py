"""The multi-worker scripts' shared ending: what the suite greps for."""
import sys


def report(rank, failures):
    """Prints "PASS rank=<r>", or "FAIL rank=<r>: ..." and exits non-zero."""
    if failures:
        print(f"FAIL rank={rank}: " + "; ".join(failures), flush=True)
        sys.exit(1)
    print(f"PASS rank={rank}", flush=True)
