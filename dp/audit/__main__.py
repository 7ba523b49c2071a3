"""`python -m dp.audit --selftest`: the seeded-fault suite (`dp.audit.selftest`); or one audit of one mechanism.

    python -m dp.audit --selftest [--jobs 2] [--json out.json]
    python -m dp.audit --mechanism ddp_skellam --noise-multiplier 0.5 --trials 500 --delta 0.1

The self-test's last line is `audit_selftest faults=5 flagged=F false_alarms=A` (F = 5 and A = 0 pass:
exit status 0). A single audit prints `audit mechanism=M claimed_eps=C empirical_eps=E eps_lower_bound=L canaries=K`.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from dp.audit.mechanisms import MECHANISMS


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dp.audit", description=__doc__.splitlines()[0])
    p.add_argument("--selftest", action="store_true", help="run the seeded-fault suite")
    p.add_argument("--jobs", type=int, default=None, help="worker processes for the suite (default: up to 2)")
    p.add_argument("--json", type=Path, default=None, help="also write the full result here")
    p.add_argument("--quiet", action="store_true", help="print only the last line")
    p.add_argument("--mechanism", choices=MECHANISMS, default="ddp_skellam")
    p.add_argument("--noise-multiplier", type=float, default=0.5)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--trials", type=int, default=500)
    p.add_argument("--canaries-per-trial", type=int, default=1)
    p.add_argument("--held-out", type=int, default=250, help="held-out canaries per trial")
    p.add_argument("--background", type=int, default=1, help="background clients per trial")
    p.add_argument("--min-clients", type=int, default=2)
    p.add_argument("--expected-clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--sampling-rate", type=float, default=1.0)
    p.add_argument("--delta", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.selftest:
        from dp.audit.selftest import run_selftest

        report = run_selftest(jobs=args.jobs, progress=not args.quiet)
        if args.json:
            args.json.write_text(json.dumps(report.to_dict(), indent=1, default=str))
        print(f"seconds={report.seconds:.1f} correct_runs={report.correct_runs}")
        print(report.last_line())
        return 0 if report.passed else 1
    from dp.audit.federated import CanaryDesign, Cohorts, audit
    from dp.audit.mechanisms import make_mechanism

    mechanism = make_mechanism(args.mechanism, dim=args.dim, noise_multiplier=args.noise_multiplier,
                               min_clients=args.min_clients, expected_clients=args.expected_clients)
    result = audit(mechanism, design=CanaryDesign(trials=args.trials, canaries_per_trial=args.canaries_per_trial,
                                                  inclusion=1.0, held_out_per_trial=args.held_out, seed=args.seed),
                   cohorts=Cohorts(background_clients=args.background, sampling_rate=args.sampling_rate,
                                   rounds=args.rounds), delta=args.delta)
    if args.json:
        args.json.write_text(json.dumps(result.to_dict(), indent=1, default=str))
    print(result.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
