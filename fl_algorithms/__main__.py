"""`python -m fl_algorithms --list`: what this toolkit offers, one line each."""
from __future__ import annotations

import argparse
import sys

from fl_algorithms.catalog import render


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fl_algorithms", description=__doc__)
    ap.add_argument("--list", action="store_true", help="print the algorithms, secure-aggregation protocols, "
                                                        "DP mechanisms, tasks and partitions")
    args = ap.parse_args(argv)
    if not args.list:
        ap.print_help()
        return 0
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
