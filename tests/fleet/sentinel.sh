# shellcheck shell=bash
# Redis behind Sentinel in the fleet test (issue 21): the scenario redis-sentinel, sc_redis_sentinel,
# for tests/fleet/run.sh to source and list last in SCENARIOS (it leaves Redis failed over). It uses
# run.sh's helpers (on, assert_route, playbook, recap_changed, signed, publish, expect, say, die,
# phase) and arrays (IP, POLLERS, APPS).
#
#   1. Deploy (its own inventory, run.sh's plus): Redis on fp-data1 (the master on the first run)
#      and fp-app2 (a replica), three sentinels on fp-data1, fp-app2 and fp-db1, the Redis backend;
#      fastpoll.ini then names the sentinels, the master's name and the sentinels' password file, no
#      Redis server and no announcement server (the announcements go to the master too). The
#      sentinels refuse a client without the password.
#   2. Under poll and publish load from the control node (tests/fleet/sentinel_load.py: plain polls
#      on both pollers, publishes through both app hosts, held polls woken by those publishes), the
#      master's redis-server is killed (SIGKILL, the unit masked so systemd does not restart it).
#      The sentinels promote fp-app2; the poll servers and the apps follow without a restart, the
#      poll servers' announcement subscribers too (every instance subscribed again, on fp-app2).
#      Then fp-data1's Redis is started again: the sentinels make it a replica of the new master.
#   3. Checked: no poll answered 5xx, polls are cache hits again after the failover, publishes answer
#      201 throughout and write the cache again (X-Cache-Publish: ok) soon after the failover, held
#      polls are woken by the announcements after the failover (median under 1 s: the re-check
#      while subscribed is 10 s); the figures are printed. Then a run of the redis plays
#      changes nothing (Ansible's redis.conf is not rewritten by the failover, the sentinels'
#      source is unchanged).

# The sentinels take the Redis password ($pass, set by sc_redis_sentinel).
sentinel_cli() { on "$1" "REDISCLI_AUTH='$pass' redis-cli --no-auth-warning -h ${IP[$1]} -p 26379 --raw ${*:2}"; }
# Every poll server instance of every poller subscribed to the announcements, within 15 s.
sentinel_subscribed() {
    local n
    for n in "${POLLERS[@]}"; do
        on "$n" bash -s <<'EOF' || { echo "$n: not subscribed to the announcements"; return 1; }
for admin in 9101 9102; do
    for _ in $(seq 1 60); do
        m=$(curl -fsS "http://127.0.0.1:$admin/metrics") && grep -qx 'fastpoll_announce_subscribed 1' <<< "$m" && continue 2
        sleep 0.25
    done
    echo "admin $admin: not subscribed"; exit 1
done
EOF
    done
}

sc_redis_sentinel() {
    local inv=$RUN/sentinel.yml pass t_kill t_promoted t_back role i line
    local pass_args=()
    # The inventory: run.sh's, with a replica and the sentinels.
    "$REPO/.venv/bin/python" - "$RUN/inventory.yml" "$inv" <<'PY' || die "cannot write the Sentinel inventory"
import sys
import yaml
with open(sys.argv[1]) as f:
    inv = yaml.safe_load(f)
children = inv["all"]["children"]
children["redis"] = {"hosts": {"fp-data1": None, "fp-app2": None}}
children["redis_sentinel"] = {"hosts": {"fp-data1": None, "fp-app2": None, "fp-db1": None}}
with open(sys.argv[2], "w") as f:
    yaml.safe_dump(inv, f, default_flow_style=False, sort_keys=False)
PY
    # After the Redis password rotation scenario the new password is the one Redis takes.
    pass=$redis_pass
    if [ -f "$RUN/secrets-redis.yml" ]; then
        pass_args=(-e "@$RUN/secrets-redis.yml")
        pass=$(sed -n 's/^fastpoll_redis_password: "\(.*\)"$/\1/p' "$RUN/secrets-redis.yml")
    fi
    INVENTORY=$inv playbook sentinel "${pass_args[@]}" -e fastpoll_cache_backend=redis -e fastpoll_cache_ttl=299 \
        --limit 'pollers:app:redis:redis_sentinel' --tags config,redis,app,pollers
    for n in "${POLLERS[@]}" "${APPS[@]}"; do
        line=$(on "$n" "sed -n 's/^sentinels = //p' /etc/fastpoll/fastpoll.ini")
        expect "$line" "${IP[fp-data1]}:26379 ${IP[fp-app2]}:26379 ${IP[fp-db1]}:26379" "$n: [redis] sentinels"
        ! on "$n" "sed -n '/^\[redis\]/,/^\[/p' /etc/fastpoll/fastpoll.ini" | grep -q '^server =' \
            || die "$n: [redis] still has a server with sentinels"
        line=$(on "$n" "sed -n 's/^sentinel_password_file = //p' /etc/fastpoll/fastpoll.ini")
        expect "$line" /etc/fastpoll/redis.pass "$n: [redis] sentinel_password_file"
        ! on "$n" "sed -n '/^\[announce\]/,/^\[/p' /etc/fastpoll/fastpoll.ini" | grep -q '^server =' \
            || die "$n: [announce] has a server with sentinels"
    done
    line=$(on fp-db1 "redis-cli -h ${IP[fp-db1]} -p 26379 --raw SENTINEL get-master-addr-by-name fastpoll" 2>&1 | head -1)
    case "$line" in NOAUTH*) ;; *) die "fp-db1's sentinel answered without the password: $line" ;; esac
    for n in fp-data1 fp-app2 fp-db1; do
        expect "$(sentinel_cli "$n" SENTINEL get-master-addr-by-name fastpoll | paste -sd' ')" \
            "${IP[fp-data1]} 6379" "$n: the sentinel's master"
    done
    role=$(on fp-app2 "REDISCLI_AUTH='$pass' redis-cli -h ${IP[fp-app2]} --user fastpoll --no-auth-warning --raw ROLE" | head -3 | paste -sd' ')
    expect "$role" "slave ${IP[fp-data1]} 6379" "fp-app2's Redis role"
    # Three sentinels know each other and the replica (their hello messages take a few seconds).
    for i in $(seq 1 60); do
        line=$(sentinel_cli fp-db1 SENTINEL master fastpoll | paste -sd' ')
        case "$line" in *"num-other-sentinels 2 "*"quorum 2"*) break ;; esac
        [ "$i" -lt 60 ] || die "fp-db1's sentinel does not see the other two: $line"
        sleep 0.5
    done
    sentinel_subscribed || die "the poll servers are not subscribed through the sentinels"
    phase "Sentinel deployed: Redis master fp-data1, replica fp-app2, 3 sentinels (password required); the Redis backend and the announcements through them"

    # ---- the failover, under load ----
    local users=() paths=() u
    for i in 0 1 2 3 4; do
        u=$((RANDOM % 9000 + 70000 + i * 10000))
        expect "$(publish fp-data1 "$u" "before the failover")" 201 "publish before the failover"
        users+=("$u")
        paths+=("$(signed "/Poll/getMessages?user_id=$u")")
    done
    for n in "${POLLERS[@]}" "${APPS[@]}"; do assert_route "${IP[$n]}"; done
    : > "$RUN/sentinel-events"
    "$REPO/.venv/bin/python" "$HERE/sentinel_load.py" --pollers "${IP[fp-poll1]},${IP[fp-poll2]}" \
        --apps "${IP[fp-data1]}:8000,${IP[fp-app2]}:8000" --token-file "$RUN/api.token" \
        --users "$(IFS=,; echo "${users[*]}")" --paths "$(printf '%s\n' "${paths[@]}" | paste -sd'|')" \
        --events "$RUN/sentinel-events" --out "$RUN/sentinel-load.json" --max-seconds 150 \
        > "$LOGS/sentinel-load.log" 2>&1 8>&- &
    local load_pid=$!
    # A failure below ends the run: the load generator with it (it would outlive the fleet).
    sentinel_die() { kill "$load_pid" 2>/dev/null; die "$@"; }
    sleep 6
    kill -0 "$load_pid" 2>/dev/null || { cat "$LOGS/sentinel-load.log"; die "the load generator ended early"; }
    t_kill=$(date +%s.%N)
    echo "kill $t_kill" >> "$RUN/sentinel-events"
    # Masked first, so systemd's Restart= does not bring an empty master back before the sentinels
    # see it gone (it would be the master again, and its replica would copy it empty).
    # SIGKILL to the main pid: systemctl kill also signals the unit's other processes, which
    # fails inside the test's containers (EIO).
    on fp-data1 'systemctl mask --runtime --quiet redis-server && pid=$(systemctl show -p MainPID --value redis-server) && [ "$pid" -gt 0 ] && kill -9 "$pid"' \
        || sentinel_die "cannot kill fp-data1's Redis"
    for i in $(seq 1 120); do
        [ "$(sentinel_cli fp-db1 SENTINEL get-master-addr-by-name fastpoll | head -1)" = "${IP[fp-app2]}" ] && break
        [ "$i" -lt 120 ] || sentinel_die "no failover to fp-app2 within 60 s"
        sleep 0.5
    done
    t_promoted=$(date +%s.%N)
    echo "promoted $t_promoted" >> "$RUN/sentinel-events"
    sentinel_subscribed || sentinel_die "the poll servers did not subscribe on the new master"
    echo "subscribed $(date +%s.%N)" >> "$RUN/sentinel-events"
    sleep 8
    on fp-data1 'systemctl unmask --runtime --quiet redis-server && systemctl start redis-server' \
        || sentinel_die "cannot start fp-data1's Redis again"
    echo "restarted $(date +%s.%N)" >> "$RUN/sentinel-events"
    for i in $(seq 1 120); do
        role=$(on fp-data1 "REDISCLI_AUTH='$pass' redis-cli -h ${IP[fp-data1]} --user fastpoll --no-auth-warning --raw ROLE" 2>/dev/null \
            | head -4 | paste -sd' ') || true
        case "$role" in "slave ${IP[fp-app2]} 6379 connected") break ;; esac
        [ "$i" -lt 120 ] || sentinel_die "fp-data1's Redis is not a replica of fp-app2 within 60 s of its start: $role"
        sleep 0.5
    done
    t_back=$(date +%s.%N)
    echo "replica $t_back" >> "$RUN/sentinel-events"
    sleep 5
    echo "stop $(date +%s.%N)" >> "$RUN/sentinel-events"
    wait "$load_pid" || { cat "$LOGS/sentinel-load.log"; die "the load generator failed"; }
    cat "$LOGS/sentinel-load.log"
    "$REPO/.venv/bin/python" "$HERE/sentinel_load.py" --check "$RUN/sentinel-load.json" --events "$RUN/sentinel-events" \
        > "$RUN/sentinel-verdict.txt" 2>&1 || { cat "$RUN/sentinel-verdict.txt"; die "Redis failover under load"; }
    sed 's/^/  /' "$RUN/sentinel-verdict.txt"
    # No restart of a poll server or an app: the same pids before and after are not needed, their
    # config did not change and nothing restarted them; the idempotency run below changes nothing.
    INVENTORY=$inv playbook sentinel-rerun "${pass_args[@]}" -e fastpoll_cache_backend=redis -e fastpoll_cache_ttl=299 \
        --limit 'redis:redis_sentinel' --tags redis
    expect "$(recap_changed)" 0 "changes by the redis plays after the failover"
    phase "Redis master killed under load: $(head -1 "$RUN/sentinel-verdict.txt"); the redis plays then change nothing"
}
