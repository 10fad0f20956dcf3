# shellcheck shell=bash disable=SC2154  # seed_user: set by run.sh
# The gated-release scenario of tests/fleet/run.sh (sourced by it; uses lib.sh's helpers): a release
# that starts healthy but cannot reach the cache stops at the first batch of pollers, by the
# rollout gate (ansible/roles/rollout_gate), with every other poller untouched; rolling that
# batch back passes the gate. Needs the upgrade scenario (release B installed).

# gate_traffic STOPFILE: bounded ab rounds against both pollers, alternating, until STOPFILE
# exists (at most 300 rounds); every answer 2xx (a poll the cache cannot answer falls back).
gate_traffic() {
    local stop=$1 i n url
    url=$(signed "/Poll/getMessages?user_id=$seed_user")
    for i in $(seq 0 299); do
        [ -e "$stop" ] && return 0
        n=${POLLERS[$((i % 2))]}
        assert_route "${IP[$n]}"
        ab -q -n 400 -c 4 -s 10 "http://${IP[$n]}$url" > "$RUN/gate-ab.txt" 2>&1 \
            || { cat "$RUN/gate-ab.txt"; echo "fleet: gated release: ab against $n failed" >&2; return 1; }
        if [ "$(awk '/^Failed requests:/{print $3}' "$RUN/gate-ab.txt")" != 0 ] || grep -q '^Non-2xx' "$RUN/gate-ab.txt"; then
            cat "$RUN/gate-ab.txt"; echo "fleet: gated release: a poll failed on $n (round $i)" >&2; return 1
        fi
        sleep 0.3
    done
}

# release_tree DIR SUFFIX: this tree's poll server sources in DIR, FP_VERSION with +SUFFIX (the
# caller then breaks them on purpose). release_build DIR NAME: builds it and the release's
# artifacts (ansible/build.sh) with it; prints the binary's sha256.
release_tree() {
    mkdir -p "$1"
    cp -r "$REPO/poll_server/Makefile" "$REPO/poll_server/src" "$1/"
    sed -i "s/#define FP_VERSION \"\(.*\)\"/#define FP_VERSION \"\1+$2\"/" "$1/src/version.h"
}
release_build() {
    make -s -C "$1" build/poll_server > "$LOGS/build-$2.log" 2>&1 || { cat "$LOGS/build-$2.log"; die "release $2 build failed"; }
    FASTPOLL_POLL_SERVER_BIN=$1/build/poll_server "$REPO/ansible/build.sh" > "$LOGS/build-$2.log" 2>&1 \
        || { cat "$LOGS/build-$2.log"; die "build.sh (release $2) failed"; }
    sha256sum < "$1/build/poll_server" | cut -d' ' -f1
}

# stopped_at_first_batch NEW_SUM B_SUM PID_8101 PID_8102 WHAT: after a rollout stopped by a
# gate, fp-poll1 runs the new release (NEW_SUM), fp-poll2 still release B with the same
# instance pids.
stopped_at_first_batch() {
    local port pid
    expect "$(on fp-poll1 sha256sum /usr/local/bin/poll_server | cut -d' ' -f1)" "$1" "fp-poll1: $5 installed (the first batch)"
    expect "$(on fp-poll2 sha256sum /usr/local/bin/poll_server | cut -d' ' -f1)" "$2" "fp-poll2: still release B (a later batch)"
    for port in 8101 8102; do
        [ "$port" = 8101 ] && pid=$3 || pid=$4
        expect "$(on fp-poll2 systemctl show -p MainPID --value "fastpoll-poller@$port.service")" "$pid" "fp-poll2:$port not restarted"
    done
}

# rollback_fp_poll1 LOG STOPFILE: fp-poll1 back to release B through rollback.sh (its batch gated).
rollback_fp_poll1() {
    (cd "$REPO/ansible" && PATH="$ANSIBLE_BIN:$PATH" FASTPOLL_ROLLBACK_TO=$RELEASE_B ./rollback.sh \
        -i "$RUN/inventory.yml" -e "@$RUN/secrets.yml" --limit fp-poll1 --tags config,pollers \
        -e rollout_gate_baseline_seconds=20) > "$1" 2>&1 \
        || { touch "$2"; tail -60 "$1"; die "rolling fp-poll1 back to release B failed"; }
}

sc_gated_release() {
# ---- release C: healthy, but its poll server dials the memcached port + 1 -------------------------
local c_dir=$RUN/v3 c_sum b_sum n port rc stop traffic_pid
declare -A PID_B=()
release_tree "$c_dir" fleet-cannot-reach-cache
sed -i 's/fp_resolve(a->host, a->port, /fp_resolve(a->host, a->port + 1, /' "$c_dir/src/cache_memcached.c"
grep -q 'a->port + 1' "$c_dir/src/cache_memcached.c" || die "could not make release C miss the cache"
c_sum=$(release_build "$c_dir" C) || exit 1
b_sum=$(on fp-poll2 sha256sum /usr/local/bin/poll_server | cut -d' ' -f1)
for n in "${POLLERS[@]}"; do
    for port in 8101 8102; do
        PID_B[$n:$port]=$(on "$n" systemctl show -p MainPID --value "fastpoll-poller@$port.service")
    done
done

# Polls for the gate's baseline (its window: the 20 s before the batch, less nginx's 5 s flush).
stop=$RUN/gate-traffic.stop
rm -f "$stop"
gate_traffic "$stop" & traffic_pid=$!
sleep 28
rc=0
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" "${EXTRA[@]}" --limit pollers \
    -e rollout_gate_baseline_seconds=20 > "$LOGS/ansible-gated-release.log" 2>&1 || rc=$?
[ "$rc" != 0 ] || { touch "$stop"; tail -40 "$LOGS/ansible-gated-release.log"; die "release C rolled out: the gate let it pass"; }
grep -q 'Rollout gate failed on fp-poll1' "$LOGS/ansible-gated-release.log" \
    || { touch "$stop"; tail -60 "$LOGS/ansible-gated-release.log"; die "the play failed, but not at fp-poll1's gate"; }
grep -q 'share of polls answered by the app' "$LOGS/ansible-gated-release.log" \
    || { touch "$stop"; tail -60 "$LOGS/ansible-gated-release.log"; die "the gate failed for another reason than the app's share"; }
stopped_at_first_batch "$c_sum" "$b_sum" "${PID_B[fp-poll2:8101]}" "${PID_B[fp-poll2:8102]}" "release C"
say "$(grep -o 'Rollout gate failed on fp-poll1[^"]*' "$LOGS/ansible-gated-release.log" | head -1)"

# ---- roll the batch back to release B, as the gate's message says: it passes the gate ------------
rollback_fp_poll1 "$LOGS/ansible-gated-rollback.log" "$stop"
grep -q 'Watch the polls and cache reads after the batch' "$LOGS/ansible-gated-rollback.log" \
    || { touch "$stop"; die "the rollback's batch was not gated"; }
touch "$stop"
wait "$traffic_pid" || die "a poll failed during the gated release"
for n in "${POLLERS[@]}"; do
    expect "$(on "$n" sha256sum /usr/local/bin/poll_server | cut -d' ' -f1)" "$b_sum" "$n: release B after the rollback"
done
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$seed_user")" "200 cache" "fp-poll1 reads the cache again"
phase "gated release: release C (cannot reach the cache) stopped by fp-poll1's gate, fp-poll2 untouched; fp-poll1 rolled back to $RELEASE_B through the gate"
}
