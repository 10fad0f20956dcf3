# shellcheck shell=bash disable=SC2154  # seed_user: set by run.sh
# The slo-gate scenario of tests/fleet/run.sh (sourced by it; uses lib.sh's helpers and
# gated-release.sh's gate_traffic): a release whose poll servers stop reading the cache 30 s
# after they start passes the per-host gate (its window is the first seconds) and is stopped by
# the fleet gate (ansible/roles/slo_gate) at the bake: Prometheus shows the app answering the
# updated poller's polls, not the other's. fp-poll2 is untouched; fp-poll1 is rolled back.
# Needs the upgrade scenario (release B installed).

sc_slo_gate() {
local d_dir=$RUN/v4 d_sum b_sum port rc stop traffic_pid
declare -A PID_B=()
release_tree "$d_dir" fleet-fails-after-30s
# Every cache read fails from 30 s after the process's first one on: its polls go to the app.
sed -i 's|^    return cache->ops->get(cache->be, key, keylen, cb, arg);|    static time_t first;\n    if (first == 0)\n        first = time(NULL);\n    if (time(NULL) - first > 30)\n        return -1;\n&|' "$d_dir/src/cache.c"
sed -i 's|^#include <stdlib.h>|&\n#include <time.h>|' "$d_dir/src/cache.c"
grep -q 'time(NULL) - first > 30' "$d_dir/src/cache.c" || die "could not make release D fail after 30 s"
d_sum=$(release_build "$d_dir" D) || exit 1
b_sum=$(on fp-poll2 sha256sum /usr/local/bin/poll_server | cut -d' ' -f1)
for port in 8101 8102; do
    PID_B[$port]=$(on fp-poll2 systemctl show -p MainPID --value "fastpoll-poller@$port.service")
done

# Polls on both pollers for both gates (the per-host gate's baseline: the 20 s before the batch).
stop=$RUN/slo-gate-traffic.stop
rm -f "$stop"
gate_traffic "$stop" & traffic_pid=$!
sleep 25
rc=0
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" "${EXTRA[@]}" --limit pollers \
    -e rollout_gate_baseline_seconds=20 -e slo_gate_enabled=true -e slo_gate_bake_seconds=40 \
    -e slo_gate_scrape_wait_seconds=15 > "$LOGS/ansible-slo-gate.log" 2>&1 || rc=$?
[ "$rc" != 0 ] || { touch "$stop"; tail -40 "$LOGS/ansible-slo-gate.log"; die "release D rolled out: the fleet gate let it pass"; }
grep -q 'Rollout gate failed' "$LOGS/ansible-slo-gate.log" \
    && { touch "$stop"; tail -60 "$LOGS/ansible-slo-gate.log"; die "the per-host gate stopped release D: its errors came too early for this test"; }
grep -q 'Fleet gate failed after the batch fp-poll1' "$LOGS/ansible-slo-gate.log" \
    || { touch "$stop"; tail -60 "$LOGS/ansible-slo-gate.log"; die "the play failed, but not at the fleet gate after fp-poll1"; }
grep -q 'share of polls answered by the app' "$LOGS/ansible-slo-gate.log" \
    || { touch "$stop"; tail -60 "$LOGS/ansible-slo-gate.log"; die "the fleet gate failed for another reason than the app's share"; }
stopped_at_first_batch "$d_sum" "$b_sum" "${PID_B[8101]}" "${PID_B[8102]}" "release D"
say "$(grep -o 'Fleet gate failed after the batch fp-poll1[^"]*' "$LOGS/ansible-slo-gate.log" | head -1)"

# ---- fp-poll1 back to release B ---------------------------------------------------------------
rollback_fp_poll1 "$LOGS/ansible-slo-gate-rollback.log" "$stop"
touch "$stop"
wait "$traffic_pid" || die "a poll failed during the release stopped by the fleet gate"
expect "$(on fp-poll1 sha256sum /usr/local/bin/poll_server | cut -d' ' -f1)" "$b_sum" "fp-poll1: release B after the rollback"
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$seed_user")" "200 cache" "fp-poll1 reads the cache again"
phase "slo gate: release D (cache reads fail 30 s after start) passed fp-poll1's own gate, stopped at the fleet gate's bake; fp-poll2 untouched; fp-poll1 rolled back"
}
