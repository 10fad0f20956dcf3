# shellcheck shell=bash
# The fleet test's lint scenario: ansible-lint (production profile) and --syntax-check, started
# before the first deploy and run beside it (lint_start); sc_lint takes the verdict. Sourced by
# tests/fleet/run.sh (which runs sc_lint as the row lint); it uses lib.sh's helpers and the
# variables of the run.

# The lint scenario starts before the first deploy and runs beside it (LINT_PID; a CPU the
# deploy's waits leave free); sc_lint, after the deploy, takes its verdict.
lint_start() {
    ( "$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" --syntax-check \
          > "$LOGS/syntax.log" 2>&1 || { echo "--syntax-check failed" > "$RUN/lint.verdict"; exit 1; }
      if [ -x "$ANSIBLE_BIN/ansible-lint" ]; then
          (cd "$REPO/ansible" && PATH="$ANSIBLE_BIN:$PATH" ansible-lint --profile production --nocolor -q) \
              > "$LOGS/lint.log" 2>&1 || { echo "ansible-lint (production profile) failed" > "$RUN/lint.verdict"; exit 1; }
          echo "ansible-lint production: clean, --syntax-check: ok" > "$RUN/lint.verdict"
      else
          echo "(no ansible-lint in $ANSIBLE_BIN), --syntax-check: ok" > "$RUN/lint.verdict"
      fi ) &
    LINT_PID=$!
}
sc_lint() {
local verdict
wait "$LINT_PID" || { verdict=$(cat "$RUN/lint.verdict" 2>/dev/null); cat "$LOGS/syntax.log" "$LOGS/lint.log" 2>/dev/null; die "${verdict:-lint failed}"; }
phase "$(cat "$RUN/lint.verdict") (beside the first deploy)"
}
