"""python -m fastpoll_testkit.contract: run the contract checker (docs/operations.md, "The contract
checker"), or check a saved history again.

    python -m fastpoll_testkit.contract --seed N --minutes M [--config NAME ...]
    python -m fastpoll_testkit.contract --short [--seed N]      # make check-contract-short
    python -m fastpoll_testkit.contract --check run/contract-.../history.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

from fastpoll_testkit.contract import interrupt
from fastpoll_testkit.contract.checker import RULES, Params, check, render
from fastpoll_testkit.contract.history import History
from fastpoll_testkit.contract.run import CONFIGS, Run, Settings
from fastpoll_testkit.stack import DEFAULT_RUN_DIR

SHORT_CONFIGS = ["mc1-sqlite", "mc3-pg"]
SHORT_SECONDS = 80.0  # per configuration: the first deck of faults (every kind once) fits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seed", type=int, default=None, help="default: drawn from the clock")
    ap.add_argument("--minutes", type=float, default=None, help="per configuration")
    ap.add_argument(
        "--config",
        action="append",
        choices=sorted(CONFIGS),
        help="repeatable; default: all (--short: mc1-sqlite and mc3-pg)",
    )
    ap.add_argument("--short", action="store_true", help=f"{SHORT_SECONDS:.0f} s per config")
    ap.add_argument("--users", type=int, default=6)
    ap.add_argument("--held-bound-ms", type=float, default=Params.held_bound_s * 1000)
    ap.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR.parent / "run" / "contract")
    ap.add_argument("--check", type=Path, help="check a saved history.jsonl again, run nothing")
    ap.add_argument(
        "--expect",
        action="append",
        choices=sorted(RULES),
        help="exit 0 only if this rule found a violation (testing the tester)",
    )
    ap.add_argument(
        "--summary",
        type=Path,
        help="write the violations per rule (over every configuration) to this JSON file",
    )
    args = ap.parse_args()
    params = Params(held_bound_s=args.held_bound_ms / 1000)

    if args.check:
        rep = check(History.read(args.check), params)
        print(render(rep))
        return 0 if rep.ok else 1

    # Interrupted, a run stops its clients, its nemesis and its stack, then the command exits.
    interrupt.install()
    seed = args.seed if args.seed is not None else int(time.time() * 1000) % 1_000_000
    configs = args.config or (SHORT_CONFIGS if args.short else sorted(CONFIGS))
    seconds = args.minutes * 60 if args.minutes else SHORT_SECONDS
    print(f"contract: seed {seed}, {seconds:.0f} s on each of {', '.join(configs)}", flush=True)
    failed: list[str] = []
    expected_found = False
    found = dict.fromkeys(RULES, 0)
    finished = True
    for name in configs:
        run_dir = (args.run_dir / f"{name}-{seed}").resolve()
        shutil.rmtree(run_dir, ignore_errors=True)
        run = Run(CONFIGS[name], Settings(seed, seconds, args.users, params), run_dir)
        t = time.monotonic()
        try:
            rep = run.run()
        except interrupt.Interrupted as e:
            run.interrupt()
            run.close()
            print(f"contract: interrupted ({e}) in {name} (seed {seed}); its stack is stopped")
            sys.stdout.flush()
            # Without waiting for the clients' threads (an HTTP call may take its full timeout).
            os._exit(128 + e.signum)
        except Exception:  # noqa: BLE001 -- a run that could not finish fails, with its seed
            traceback.print_exc()
            print(f"contract: {name} did not finish (seed {seed}); logs in {run_dir}")
            failed.append(name)
            finished = False
            continue
        finally:
            run.close()
        print(render(rep))
        for note in run.history.notes:
            print(f"  note: {note}")
        print(f"  history: {run_dir / 'history.jsonl'} ({time.monotonic() - t:.0f} s in all)")
        print(
            f"  replay:  make check-contract SEED={seed} MINUTES={seconds / 60:.4g} "
            f"CONFIG={name}\n",
            flush=True,
        )
        if not rep.ok:
            failed.append(name)
        if rep.void:  # its violations are the harness's as much as the system's
            finished = False
            continue
        for rule, res in rep.rules.items():
            found[rule] += len(res.violations)
        if args.expect and any(rep.rules[r].violations for r in args.expect):
            expected_found = True
    if args.summary:
        args.summary.write_text(json.dumps({"finished": finished, "violations": found}))
    if args.expect:
        print(
            f"contract: rules {', '.join(args.expect)}: "
            f"{'violation found' if expected_found else 'NO violation found'}"
            f" (seed {seed})"
        )
        return 0 if expected_found else 1
    print(f"contract: {'FAILED on ' + ', '.join(failed) if failed else 'passed'} (seed {seed})")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except interrupt.Interrupted as e:  # between runs: no stack is up
        sys.exit(128 + e.signum)
