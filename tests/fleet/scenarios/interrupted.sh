# shellcheck shell=bash
# The fleet test's interrupted scenario: an interrupted ansible-playbook run, then a re-run: every
# instance on the new config. Sourced by tests/fleet/run.sh (which runs sc_interrupted as the row
# interrupted); it uses lib.sh's helpers and the variables of the run.

sc_interrupted() {
# ---- 12. an interrupted run, then a re-run: every instance runs the new config -------------------
assert_all_routes
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" "${EXTRA[@]}" \
    -e fastpoll_cache_ttl=299 > "$LOGS/ansible-interrupted.log" 2>&1 &
ip_pid=$!
# Interrupted once the config files are written everywhere and the first app host is being handled.
for _ in $(seq 1 400); do grep -q 'PLAY \[Fallback app' "$LOGS/ansible-interrupted.log" && break; sleep 0.5; done
kill -INT "$ip_pid" 2>/dev/null || true
sleep 2
kill -TERM "$ip_pid" 2>/dev/null || true
wait "$ip_pid" || true
if grep -q 'PLAY \[Poll servers' "$LOGS/ansible-interrupted.log"; then die "the interrupted run got to the pollers: interrupt earlier"; fi
left=$(on fp-poll1 /usr/local/libexec/fastpoll-stale --config /etc/fastpoll/fastpoll.ini \
    fastpoll-poller@8101.service=http://127.0.0.1:9101/metrics)
say "after the interrupted run, fp-poll1: $left"
# The re-run on the hosts whose services read fastpoll.ini, through the plays that restart them.
playbook rerun -e fastpoll_cache_ttl=299 --limit 'pollers:app' --tags config,app,pollers
check_converged
phase "interrupted run + re-run: every instance runs the new config"
}
