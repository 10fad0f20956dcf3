# shellcheck shell=bash disable=SC2154  # seed_user: set by run.sh
# The fleet test's upgrade scenario: a rolling upgrade to release B under ab rounds: 0 failed, every
# instance restarted. Sourced by tests/fleet/run.sh (which runs sc_upgrade as the row upgrade); it
# uses lib.sh's helpers and the variables of the run.

sc_upgrade() {
# ---- 9. rolling upgrade under load ------------------------------------------------------------
# A new version: the same source with another version string, built on the control node.
if [ -n "${FLEET_POLL_SERVER_BIN:-}" ]; then
    cp "$POLL_SERVER_BIN" "$RUN/poll_server-v2"
    printf '\n# v2\n' >> "$RUN/poll_server-v2"
    NEW_BIN=$RUN/poll_server-v2
else
    mkdir -p "$RUN/v2"
    cp -r "$REPO/poll_server/Makefile" "$REPO/poll_server/src" "$RUN/v2/"
    sed -i 's/#define FP_VERSION "\(.*\)"/#define FP_VERSION "\1+fleet-upgrade"/' "$RUN/v2/src/version.h"
    grep -q 'fleet-upgrade' "$RUN/v2/src/version.h" || die "could not set a new version string"
    make -s -C "$RUN/v2" build/poll_server > "$LOGS/build-v2.log" 2>&1 || { cat "$LOGS/build-v2.log"; die "v2 build failed"; }
    NEW_BIN=$RUN/v2/build/poll_server
fi
new_sum=$(sha256sum < "$NEW_BIN" | cut -d' ' -f1)
declare -A OLDPID=()
for n in "${POLLERS[@]}"; do
    for port in 8101 8102; do
        OLDPID[$n:$port]=$(on "$n" systemctl show -p MainPID --value "fastpoll-poller@$port.service")
    done
done

# The upgrade runs in the background; ab runs bounded rounds (1000 requests, 5 concurrent, 10 s
# timeout each, 0.5 s apart) against both pollers, alternating, until it is done. Every round must have 0
# failed and 0 non-2xx requests.
# Release B: the new binary with the same wheelhouse; build/current now names it.
FASTPOLL_POLL_SERVER_BIN=$NEW_BIN "$REPO/ansible/build.sh" > "$LOGS/build-v2.log" 2>&1 \
    || { cat "$LOGS/build-v2.log"; die "build.sh (release B) failed"; }
RELEASE_B=$(cat "$FASTPOLL_BUILD_DIR/current/RELEASE")
[ "$RELEASE_B" != "$RELEASE_A" ] || die "release B has the id of release A"
assert_all_routes
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" "${EXTRA[@]}" --limit pollers \
    > "$LOGS/ansible-upgrade.log" 2>&1 &
upgrade_pid=$!
rounds=0 total=0
ab_path=$(signed "/Poll/getMessages?user_id=$seed_user")
while kill -0 "$upgrade_pid" 2>/dev/null && [ "$rounds" -lt 300 ]; do
    n=${POLLERS[$((rounds % 2))]}
    assert_route "${IP[$n]}"
    ab -q -n 1000 -c 5 -s 10 "http://${IP[$n]}$ab_path" > "$RUN/ab.txt" 2>&1 \
        || { cat "$RUN/ab.txt"; die "ab against $n failed"; }
    failed=$(awk '/^Failed requests:/{print $3}' "$RUN/ab.txt")
    complete=$(awk '/^Complete requests:/{print $3}' "$RUN/ab.txt")
    non2xx=$(awk '/^Non-2xx responses:/{print $3}' "$RUN/ab.txt")
    [ "$failed" = 0 ] && [ -z "$non2xx" ] && [ "$complete" = 1000 ] \
        || { cat "$RUN/ab.txt"; die "ab round $rounds against $n during the upgrade: failed=$failed non-2xx=${non2xx:-0}"; }
    rounds=$((rounds + 1)); total=$((total + complete))
    # A pause between rounds leaves the play CPU (two cores): load still overlaps every restart.
    sleep 0.5
done
wait "$upgrade_pid" || { tail -60 "$LOGS/ansible-upgrade.log"; die "the upgrade playbook failed"; }
[ "$rounds" -ge 2 ] || die "only $rounds ab rounds overlapped the upgrade"
for n in "${POLLERS[@]}"; do
    sum=$(on "$n" sha256sum /usr/local/bin/poll_server | cut -d' ' -f1)
    expect "$sum" "$new_sum" "$n: binary after the upgrade"
    for port in 8101 8102; do
        p=$(on "$n" systemctl show -p MainPID --value "fastpoll-poller@$port.service")
        [ "$p" != "${OLDPID[$n:$port]}" ] && [ "$p" != 0 ] || die "$n:$port was not restarted (pid $p)"
    done
done
check_instances 2
phase "rolling upgrade: $total requests in $rounds ab rounds, 0 failed, every instance restarted"
}
