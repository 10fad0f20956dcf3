# shellcheck shell=bash disable=SC2154  # seed_user: set by run.sh
# The fleet test's rollback scenario: ansible/rollback.sh from release B to A (needs upgrade).
# Sourced by tests/fleet/run.sh (which runs sc_rollback as the row rollback); it uses lib.sh's
# helpers and the variables of the run.

sc_rollback() {
# ---- 14. rollback to the previous release --------------------------------------------------------
assert_all_routes
# Only the pollers and the app hosts run a release's artifacts (and only their plays install them).
(cd "$REPO/ansible" && PATH="$ANSIBLE_BIN:$PATH" ./rollback.sh -i "$RUN/inventory.yml" -e "@$RUN/secrets.yml" \
    -e fastpoll_cache_ttl=299 --limit 'pollers:app' --tags config,app,pollers) > "$LOGS/ansible-rollback.log" 2>&1 \
    || { tail -40 "$LOGS/ansible-rollback.log"; die "rollback.sh failed"; }
old_sum=$(sha256sum < "$POLL_SERVER_BIN" | cut -d' ' -f1)
for n in "${POLLERS[@]}"; do
    expect "$(on "$n" sha256sum /usr/local/bin/poll_server | cut -d' ' -f1)" "$old_sum" "$n: binary after the rollback"
    expect "$(on "$n" cat /etc/fastpoll/installed/poll_server)" "$RELEASE_A" "$n: release after the rollback"
done
check_converged
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$seed_user" | cut -d' ' -f1)" 200 "a poll after the rollback"
phase "rollback: $RELEASE_B -> $RELEASE_A with ansible/rollback.sh, every instance on the old binary"
}
