"""Testing the tester (make check-contract-defects): each patch in tests/contract/defects/ puts
one fixed defect back. For each, a copy of the committed tree (git archive HEAD) gets the patch,
its poll server is built, and the checker's short run goes on the copy: the kit, the app, the
nginx templates and the poll server all come from the copy (PYTHONPATH ahead of the editable
installs; the copy's .venv is a link to this one). The run must find a violation of the rules
that defect breaks, which the patch names in its header (a line `Expect: 2-nothing-lost`); a patch
without one is refused before anything runs (exit 2). A defect whose race the short run meets too
rarely names a longer run in its header (`Run: --minutes 10 --config mc1-sqlite`). The command
fails if any defect goes unnoticed.

Interrupted (SIGINT, SIGTERM), it stops every process it started, by pid: the build or the run
first (SIGTERM: the run stops its stack), then anything still running under it (it is their
subreaper, so even a process whose parent died is found), and removes the copy.

    python -m fastpoll_testkit.contract.defects [--seed N] [--baseline] [PATCH ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
from fastpoll_testkit.contract.checker import RULES
from fastpoll_testkit.contract.run import CONFIGS
from fastpoll_testkit.stack import ROOT

DEFECTS = ROOT / "tests" / "contract" / "defects"
# How long a run has to stop its stack once interrupted (a fault in progress ends first).
STOP_GRACE_S = 60.0
# A patch names the rules it breaks (docs/api.md, "The contract, as checked") in its header,
# before the diff: a line `Expect: 2-nothing-lost, 3-held-bound`.
EXPECT_RE = re.compile(r"^Expect:\s*(.*?)\s*$", re.MULTILINE)
# A defect whose race the short run meets too rarely names a longer run instead (docs/
# operations.md, "Testing the tester"): a line `Run: --minutes 10 --config mc1-sqlite`.
RUN_RE = re.compile(r"^Run:\s*(.*?)\s*$", re.MULTILINE)
RUN_MAX_MINUTES = 15.0


class NoExpectation(ValueError):
    """A patch that does not say which rules it breaks: refused (a run that found nothing would
    otherwise pass for a found defect)."""


def _header(patch_text: str) -> str:
    """What a patch says before its first diff."""
    if patch_text.startswith("diff --git "):
        return ""
    return patch_text.split("\ndiff --git ", 1)[0]


def run_args(patch_text: str, name: str = "patch") -> list[str]:
    """The checker's arguments for the patch's run: `--short`, or its `Run:` line's (only
    `--minutes M`, at most RUN_MAX_MINUTES, and `--config NAME`, each a configuration of the
    checker). NoExpectation if the line says anything else."""
    m = RUN_RE.search(_header(patch_text))
    if m is None:
        return ["--short"]
    words = m.group(1).split()
    out: list[str] = []
    minutes = False
    while words:
        flag, value = words.pop(0), words.pop(0) if words else ""
        if flag == "--minutes":
            try:
                ok = 0 < float(value) <= RUN_MAX_MINUTES
            except ValueError:
                ok = False
            if not ok:
                raise NoExpectation(
                    f"{name}: `Run: --minutes {value}`: a number of minutes, at most "
                    f"{RUN_MAX_MINUTES:g}"
                )
            minutes = True
        elif flag == "--config":
            if value not in CONFIGS:
                raise NoExpectation(
                    f"{name}: `Run: --config {value}`: not a configuration "
                    f"(known: {', '.join(sorted(CONFIGS))})"
                )
        else:
            raise NoExpectation(f"{name}: `Run:` takes --minutes M and --config NAME, not {flag}")
        out += [flag, value]
    if not minutes:
        raise NoExpectation(f"{name}: its `Run:` line names no --minutes")
    return out


def expected_rules(patch_text: str, name: str = "patch") -> list[str]:
    """The rules of the patch's `Expect:` line (in the header, before its first diff), each a
    rule of checker.RULES. NoExpectation if there is none, it is empty, or it names another."""
    m = EXPECT_RE.search(_header(patch_text))
    if m is None:
        raise NoExpectation(f"{name}: no `Expect: <rule>, ...` line in its header")
    rules = [r.strip() for r in m.group(1).split(",") if r.strip()]
    if not rules:
        raise NoExpectation(f"{name}: its `Expect:` line names no rule")
    unknown = [r for r in rules if r not in RULES]
    if unknown:
        raise NoExpectation(
            f"{name}: `Expect:` names {', '.join(unknown)}, not rules (known: {', '.join(RULES)})"
        )
    return rules


def verdict(expect: list[str], found: dict[str, int] | None) -> tuple[bool, str]:
    """(passed, the summary's words) for one run. expect: the patch's rules ([] for the
    baseline, HEAD unpatched); found: violations per rule over the run's configurations, None if
    the run did not finish (no summary). A patch passes only if one of its rules was violated;
    the baseline's verdict is informative (it passes either way)."""
    if found is None:
        return (not expect, "did not finish (see above)")
    hits = [(r, n) for r, n in found.items() if n]
    if not expect:
        if not hits:
            return True, "nothing found"
        return True, "violations: " + ", ".join(f"rule {r}: {n}" for r, n in hits)
    wanted = [(r, found.get(r, 0)) for r in expect if found.get(r, 0)]
    if not wanted:
        also = [f"rule {r}: {n}" for r, n in hits]
        words = f"NOT FOUND (no violation of {', '.join(expect)})"
        return False, words + (f"; other violations: {', '.join(also)}" if also else "")
    words = "FOUND (" + ", ".join(f"rule {r}: {n} violations" for r, n in wanted) + ")"
    return True, words


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


def run_on(top: Path, seed: int, summary: Path, how: list[str]) -> dict[str, int] | None:
    """The run (how: run_args) on the copy; the violations per rule it found (None: it did not
    finish)."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{top / 'testkit'}:{top / 'fallback_app'}",
        "FP_POLL_SERVER": str(top / "poll_server" / "build" / "poll_server"),
        "FP_GIT_DIR": str(ROOT),  # the copy has no repository: earlier releases come from here
    }
    argv = [
        sys.executable,
        "-m",
        "fastpoll_testkit.contract",
        *how,
        "--seed",
        str(seed),
        "--run-dir",
        str(ROOT / "run" / "contract-defects" / top.name),
        "--summary",
        str(summary),
    ]
    run_child(argv, env=env, cwd=top)
    try:
        doc = json.loads(summary.read_text())
    except (OSError, ValueError):
        return None
    if not doc.get("finished"):
        return None
    return {str(k): int(v) for k, v in doc["violations"].items()}


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
    expects: dict[Path, list[str]] = {}
    runs: dict[Path | None, list[str]] = {None: ["--short"]}
    try:
        for patch in patches:
            if patch is not None:
                text = patch.read_text()
                expects[patch] = expected_rules(text, patch.name)
                runs[patch] = run_args(text, patch.name)
    except (NoExpectation, OSError) as e:
        print(f"contract defects: refused: {e}", file=sys.stderr)
        return 2
    interrupt.adopt_orphans()
    interrupt.install()
    try:
        results = run_all(patches, expects, runs, seed)
    except interrupt.Interrupted as e:
        print(
            f"\ncontract defects: interrupted ({e}); every process started is stopped", flush=True
        )
        return 128 + e.signum
    print(f"\ncontract defects (seed {seed}):")
    for name, _passed, words in results:
        print(f"  {name:<32} {words}")
    return 0 if all(passed for _, passed, _ in results) else 1


def run_all(
    patches: list[Path | None],
    expects: dict[Path, list[str]],
    runs: dict[Path | None, list[str]],
    seed: int,
) -> list[tuple[str, bool, str]]:
    results: list[tuple[str, bool, str]] = []
    for patch in patches:
        name = patch.name if patch else "HEAD (no patch)"
        expect = expects[patch] if patch else []
        print(
            f"\n=== {name}: expecting a violation of {', '.join(expect) or 'nothing'} "
            f"(seed {seed}, {' '.join(runs[patch])})",
            flush=True,
        )
        top = Path(tempfile.mkdtemp(prefix="fastpoll-defect-"))
        summary = top.with_name(top.name + ".summary.json")
        try:
            copy_tree(top, patch)
            found = run_on(top, seed, summary, runs[patch])
        finally:
            shutil.rmtree(top, ignore_errors=True)
            summary.unlink(missing_ok=True)
        passed, words = verdict(expect, found)
        print(f"=== {name}: {words}", flush=True)
        results.append((name, passed, words))
    return results


if __name__ == "__main__":
    sys.exit(main())
