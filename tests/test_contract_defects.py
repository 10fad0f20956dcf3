"""The defects tool's verdicts (fastpoll_testkit/contract/defects.py), without running a stack:
each patch names the rules it breaks in its header, a patch that names none is refused, and a run
that found nothing is never reported as a found defect."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fastpoll_testkit.contract.defects import (
    DEFECTS,
    NoExpectation,
    expected_rules,
    run_args,
    verdict,
)

DIFF = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"


def test_the_expectation_is_read_from_the_header() -> None:
    text = "Defect: something put back.\nExpect: 2-nothing-lost, 3-held-bound\n\n" + DIFF
    assert expected_rules(text) == ["2-nothing-lost", "3-held-bound"]


def test_a_patch_without_an_expectation_is_refused() -> None:
    with pytest.raises(NoExpectation, match="no `Expect:"):
        expected_rules("Defect: something put back.\n\n" + DIFF, "x.patch")
    with pytest.raises(NoExpectation):
        expected_rules(DIFF)
    with pytest.raises(NoExpectation, match="names no rule"):
        expected_rules("Expect:\n" + DIFF)


def test_an_expect_line_inside_the_diff_does_not_count() -> None:
    with pytest.raises(NoExpectation):
        expected_rules("Header.\n\n" + DIFF + "+Expect: 1-no-stale\n")


def test_an_unknown_rule_is_refused() -> None:
    with pytest.raises(NoExpectation, match="not rules"):
        expected_rules("Expect: 2-nothing-lost, 9-made-up\n\n" + DIFF)


def test_every_shipped_patch_states_its_rules() -> None:
    patches = sorted(DEFECTS.glob("*.patch"))
    assert patches
    for p in patches:
        assert expected_rules(p.read_text(), p.name)
        assert run_args(p.read_text(), p.name)


def test_a_patch_runs_short_unless_its_header_names_a_longer_run() -> None:
    assert run_args("Expect: 1-no-stale\n\n" + DIFF) == ["--short"]
    text = "Expect: 1-no-stale\nRun: --minutes 10 --config mc1-sqlite\n\n" + DIFF
    assert run_args(text) == ["--minutes", "10", "--config", "mc1-sqlite"]
    # A Run: line inside the diff is the diff's.
    assert run_args("Expect: 1-no-stale\n\n" + DIFF + "+Run: --minutes 3\n") == ["--short"]


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("Run: --config mc1-sqlite", "names no --minutes"),
        ("Run: --minutes 90", "at most"),
        ("Run: --minutes soon", "a number of minutes"),
        ("Run: --minutes 5 --config mc9", "not a configuration"),
        ("Run: --minutes 5 --seed 3", "not --seed"),
    ],
)
def test_a_run_line_other_than_minutes_and_configs_is_refused(line: str, words: str) -> None:
    with pytest.raises(NoExpectation, match=words):
        run_args(f"Expect: 1-no-stale\n{line}\n\n" + DIFF, "x.patch")


def test_a_run_that_found_nothing_is_not_found() -> None:
    passed, words = verdict(["2-nothing-lost"], {"1-no-stale": 0, "2-nothing-lost": 0})
    assert not passed
    assert words == "NOT FOUND (no violation of 2-nothing-lost)"


def test_a_violation_of_another_rule_is_not_the_defect() -> None:
    passed, words = verdict(["3-held-bound"], {"1-no-stale": 2, "3-held-bound": 0})
    assert not passed
    assert words.startswith("NOT FOUND (no violation of 3-held-bound)")
    assert "rule 1-no-stale: 2" in words


def test_a_violation_of_an_expected_rule_is_found() -> None:
    passed, words = verdict(["5-nginx-poller", "6-hostile"], {"5-nginx-poller": 0, "6-hostile": 3})
    assert passed
    assert words == "FOUND (rule 6-hostile: 3 violations)"


def test_a_run_that_did_not_finish_is_not_found() -> None:
    passed, words = verdict(["2-nothing-lost"], None)
    assert not passed and "did not finish" in words


def test_the_baseline_says_what_it_found() -> None:
    assert verdict([], {"1-no-stale": 0}) == (True, "nothing found")
    passed, words = verdict([], {"1-no-stale": 1, "2-nothing-lost": 0})
    assert words == "violations: rule 1-no-stale: 1"


def test_the_command_refuses_a_patch_without_an_expectation(tmp_path: Path) -> None:
    patch = tmp_path / "9-nothing.patch"
    patch.write_text("Defect 9 put back, but no rule named.\n\n" + DIFF)
    proc = subprocess.run(
        [sys.executable, "-m", "fastpoll_testkit.contract.defects", str(patch)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "refused" in proc.stderr and "FOUND" not in proc.stdout


@pytest.mark.parametrize("patch", sorted(DEFECTS.glob("*.patch")), ids=lambda p: p.name)
def test_every_shipped_patch_applies_to_this_tree(patch: Path) -> None:
    """A patch the code moved away from would make check-contract-defects fail to build its copy,
    not test the checker: each must still apply (git apply --check, nothing written)."""
    root = DEFECTS.parents[2]
    r = subprocess.run(
        ["git", "apply", "--check", str(patch)], cwd=root, capture_output=True, text=True
    )
    assert r.returncode == 0, f"{patch.name} no longer applies: {r.stderr}"
