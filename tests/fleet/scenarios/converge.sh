# shellcheck shell=bash
# The fleet test's converge scenario: the second run changes nothing (fleet and fp-solo), with
# --check --diff at the same time. Sourced by tests/fleet/run.sh (which runs sc_converge as the row
# converge); it uses lib.sh's helpers and the variables of the run.

sc_converge() {
# The second run and --check --diff on the converged fleet at the same time (neither changes
# anything when the first run converged; the second run's changed=0 proves it).
assert_all_routes
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" "${EXTRA[@]}" --check --diff \
    > "$LOGS/ansible-check-diff.log" 2>&1 &
check_pid=$!
solo second-run
playbook second-run
changed=$(recap_changed)
[ "$changed" = 0 ] || { grep -E '^(changed|TASK)' "$LAST_LOG" | grep -B1 '^changed' ; die "second run changed $changed things (want 0)"; }
solo_wait "second run"
changed=$(recap_changed "$SOLO_LOG.ansible")
[ "$changed" = 0 ] || { grep -B1 '^changed' "$SOLO_LOG.ansible"; die "fp-solo: second run changed $changed things (want 0)"; }
wait "$check_pid" || { tail -60 "$LOGS/ansible-check-diff.log"; die "--check --diff failed"; }
phase "second run: changed=0 (fleet and fp-solo); --check --diff on the deployed fleet: ok"
}
