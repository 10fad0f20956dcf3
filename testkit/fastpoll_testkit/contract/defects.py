"""Testing the tester (make check-contract-defects): each patch in tests/contract/defects/ puts
one fixed defect back. For each, a copy of the committed tree (git archive HEAD) gets the patch,
its poll server is built, and the checker's short run goes on the copy: the kit, the app, the
nginx templates and the poll server all come from the copy (PYTHONPATH ahead of the editable
installs; the copy's .venv is a link to this one). The run must find a violation of the rules
that defect breaks; the command fails if any defect goes unnoticed.

Interrupted (SIGINT, SIGTERM), it stops every process it started, by pid: the build or the run
first (SIGTERM: the run stops its stack), then anything still running under it (it is their
subreaper, so even a process whose parent died is found), and removes the copy.

    python -m fastpoll_testkit.contract.defects [--seed N] [--baseline] [PATCH ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fastpoll_testkit import procs
from fastpoll_testkit.contract import interrupt
from fastpoll_testkit.stack import ROOT

DEFECTS = ROOT / "tests" / "contract" / "defects"
# How long a run has to stop its stack once interrupted (a fault in progress ends first).
STOP_GRACE_S = 60.0

# What each defect breaks (docs/api.md, "The contract, as checked"), by the patch's number.
EXPECT = {
    "1": ["5-nginx-poller", "6-hostile"],  # a hostile wait marks pollers failed
    # A late cache write overwrites a newer answer and nothing repairs it: the closing hold
    # leaves it for rule 2 (rule 1 alone would not tell it from a pending write's stale reads).
    "2": ["2-nothing-lost"],
    "5": ["3-held-bound"],  # an announcement during a poll's first cache read is lost
}


def run_child(argv: list[str], **kw: Any) -> int:
    """argv in a session of its own (a terminal's ^C reaches this command only), waited for. On
    an interruption: SIGTERM, STOP_GRACE_S to exit, then every process left under this one is
    stopped by pid."""
    popen = subprocess.Popen(argv, start_new_session=True, **kw)
    try:
        code = popen.wait()
    except BaseException:
        stop_everything(popen)
        raise
    left = interrupt.descendants(os.getpid())
    if left:  # the child's own cleanup missed them
        print(f"contract defects: {argv[0]} left pids {[p for p, _ in left]}; stopping them")
        interrupt.stop(left)
    interrupt.reap()  # orphans of the child that exited, adopted
    return code


def stop_everything(popen: subprocess.Popen[bytes]) -> None:
    if popen.poll() is None:
        popen.send_signal(signal.SIGCONT)
    procs.terminate(popen, STOP_GRACE_S)
    interrupt.stop(interrupt.descendants(os.getpid()))


def copy_tree(top: Path, patch: Path | None) -> None:
    """HEAD (plus the patch) in the directory top, its poll server built."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(top)], input=archive, check=True)
    if patch is not None:
        subprocess.run(["git", "apply", str(patch.resolve())], cwd=top, check=True)
    (top / ".venv").symlink_to(ROOT / ".venv")
    jobs = str(min(2, os.cpu_count() or 1))
    argv = ["make", "-s", "-C", str(top / "poll_server"), "-j", jobs]
    if run_child(argv, stdout=subprocess.DEVNULL) != 0:
        raise subprocess.CalledProcessError(1, argv)


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
    return run_child(argv, env=env, cwd=top)


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
    interrupt.adopt_orphans()
    interrupt.install()
    try:
        results = run_all(patches, seed)
    except interrupt.Interrupted as e:
        print(
            f"\ncontract defects: interrupted ({e}); every process started is stopped", flush=True
        )
        return 128 + e.signum
    print(f"\ncontract defects (seed {seed}):")
    for name, verdict in results:
        print(f"  {name:<28} {verdict}")
    return 1 if any(v == "NOT FOUND" for _, v in results) else 0


def run_all(patches: list[Path | None], seed: int) -> list[tuple[str, str]]:
    results: list[tuple[str, str]] = []
    for patch in patches:
        name = patch.name if patch else "HEAD (no patch)"
        expect = EXPECT.get(patch.name.split("-")[0], []) if patch else []
        print(
            f"\n=== {name}: expecting a violation of {expect or 'nothing'} (seed {seed})",
            flush=True,
        )
        top = Path(tempfile.mkdtemp(prefix="fastpoll-defect-"))
        try:
            copy_tree(top, patch)
            code = run_on(top, seed, expect)
        finally:
            shutil.rmtree(top, ignore_errors=True)
        if patch is None:
            results.append((name, "passed" if code == 0 else "violations (see above)"))
        else:
            results.append((name, "FOUND" if code == 0 else "NOT FOUND"))
    return results


if __name__ == "__main__":
    sys.exit(main())
