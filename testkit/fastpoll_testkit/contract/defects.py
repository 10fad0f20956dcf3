"""Testing the tester (make check-contract-defects): each patch in tests/contract/defects/ puts
one fixed defect back. For each, a copy of the committed tree (git archive HEAD) gets the patch,
its poll server is built, and the checker's short run goes on the copy: the kit, the app, the
nginx templates and the poll server all come from the copy (PYTHONPATH ahead of the editable
installs; the copy's .venv is a link to this one). The run must find a violation of the rules
that defect breaks; the command fails if any defect goes unnoticed.

    python -m fastpoll_testkit.contract.defects [--seed N] [--baseline] [PATCH ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fastpoll_testkit.stack import ROOT

DEFECTS = ROOT / "tests" / "contract" / "defects"
# What each defect breaks (docs/api.md, "The contract, as checked"), by the patch's number.
EXPECT = {
    "1": ["5-nginx-poller", "6-hostile"],  # a hostile wait marks pollers failed
    # A late cache write overwrites a newer answer and nothing repairs it: the closing hold
    # leaves it for rule 2 (rule 1 alone would not tell it from a pending write's stale reads).
    "2": ["2-nothing-lost"],
    "5": ["3-held-bound"],  # an announcement during a poll's first cache read is lost
}


def copy_tree(patch: Path | None) -> Path:
    """HEAD (plus the patch) in a temporary directory, its poll server built."""
    top = Path(tempfile.mkdtemp(prefix="fastpoll-defect-"))
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(top)], input=archive, check=True)
    if patch is not None:
        subprocess.run(["git", "apply", str(patch.resolve())], cwd=top, check=True)
    (top / ".venv").symlink_to(ROOT / ".venv")
    jobs = str(min(2, os.cpu_count() or 1))
    subprocess.run(
        ["make", "-s", "-C", str(top / "poll_server"), "-j", jobs],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return top


def run_on(top: Path, seed: int, expect: list[str]) -> int:
    env = {
        **os.environ,
        "PYTHONPATH": f"{top / 'testkit'}:{top / 'fallback_app'}",
        "FP_POLL_SERVER": str(top / "poll_server" / "build" / "poll_server"),
    }
    argv = [
        sys.executable,
        "-m",
        "fastpoll_testkit.contract",
        "--short",
        "--seed",
        str(seed),
        "--run-dir",
        str(ROOT / "run" / "contract-defects" / top.name),
    ]
    for rule in expect:
        argv += ["--expect", rule]
    return subprocess.run(argv, env=env, cwd=top, check=False).returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--baseline", action="store_true", help="also run HEAD without a patch")
    ap.add_argument("patches", nargs="*", type=Path)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int(time.time() * 1000) % 1_000_000
    patches: list[Path | None] = [*(args.patches or sorted(DEFECTS.glob("*.patch")))]
    if args.baseline:
        patches.insert(0, None)
    if not patches:
        print(f"no patches in {DEFECTS}", file=sys.stderr)
        return 2
    results: list[tuple[str, str]] = []
    for patch in patches:
        name = patch.name if patch else "HEAD (no patch)"
        expect = EXPECT.get(patch.name.split("-")[0], []) if patch else []
        print(
            f"\n=== {name}: expecting a violation of {expect or 'nothing'} (seed {seed})",
            flush=True,
        )
        top = copy_tree(patch)
        try:
            code = run_on(top, seed, expect)
        finally:
            shutil.rmtree(top, ignore_errors=True)
        if patch is None:
            results.append((name, "passed" if code == 0 else "violations (see above)"))
        else:
            results.append((name, "FOUND" if code == 0 else "NOT FOUND"))
    print(f"\ncontract defects (seed {seed}):")
    for name, verdict in results:
        print(f"  {name:<28} {verdict}")
    return 1 if any(v == "NOT FOUND" for _, v in results) else 0


if __name__ == "__main__":
    sys.exit(main())
