# shellcheck shell=bash
# PostgreSQL with failover and backups off the database host in the fleet test, sourced
# by tests/fleet/run.sh, which runs sc_postgres_ha as the scenario postgres-ha. It uses lib.sh's
# helpers (on, assert_route, publish, signed, expect, say, die, phase) and arrays (IP, POLLERS, APPS).
#
# The fleet's inventory (lib.sh): PostgreSQL on fp-db1 and fp-app2 under Patroni (a primary and a
# synchronous standby), etcd on fp-db1, fp-app2 and fp-mon1, pgBackRest's repository on fp-mon1
# and a second, encrypted one on fp-data1 (WAL archived to both as written, a full backup in each
# taken by the first deploy).
#
#   1. Point-in-time restore: publish A, note the primary's clock, publish B; on fp-mon1,
#      fastpoll-pg-pitr restores the repository to that time into a scratch cluster: A is there,
#      B is not; the same from the second, encrypted repository on fp-data1. The backup metric
#      (node_exporter's textfile) and repo2's encryption are checked too.
#   2. Failover under load (tests/fleet/pg_ha_load.py: publishes through both app hosts, polls
#      through both pollers): the primary's Patroni and PostgreSQL are killed (SIGKILL, the unit
#      masked so systemd does not restart it). Checked: every acknowledged (201) publish is in the
#      database after the failover, none twice; publishes succeed again within 30 s (the gap is
#      printed); polls answered 2xx throughout (at most 1 % not). Then the old primary's Patroni
#      starts again and it follows as the synchronous standby; WAL reaches the repository from the
#      new primary (pgbackrest check).
#   3. The backup host unreachable (its pgBackRest server stopped) while the primary writes and
#      switches WAL segments: the archive command fails (pg_stat_archiver counts it; Prometheus has
#      WalArchivingFailing pending for it) and the segments wait on the primary, none dropped; publishes are
#      acknowledged throughout. The server started again, the queue drains by itself: the last
#      segment switched is archived, no failure after it, and pgbackrest check passes.

# patroni_role HOST: "primary", "replica" or "-" from HOST's Patroni REST API (asked on the host).
patroni_role() {
    local code
    code=$(on "$1" curl -s -m 2 -o /dev/null -w '%{http_code}' "http://${IP[$1]}:8008/primary" 2>/dev/null) || code=000
    if [ "$code" = 200 ]; then echo primary; return; fi
    code=$(on "$1" curl -s -m 2 -o /dev/null -w '%{http_code}' "http://${IP[$1]}:8008/replica" 2>/dev/null) || code=000
    if [ "$code" = 200 ]; then echo replica; else echo -; fi
}
pg_primary() {
    local n
    for n in fp-db1 fp-app2; do [ "$(patroni_role "$n")" = primary ] && { echo "$n"; return; }; done
    echo -
}
pg_sql() { on "$1" "cd / && runuser -u postgres -- psql -X -q -t -A -v ON_ERROR_STOP=1 -d fastpoll" <<<"$2"; }
# pitr_messages HOST TIME USER: on repository host HOST, `pgbackrest check` (it switches the WAL
# segment and waits for it there: every commit so far is in that repository), then
# fastpoll-pg-pitr to TIME into its scratch cluster; prints USER's messages there, comma-joined.
pitr_messages() {
    local out
    on "$1" "runuser -u pgbackrest -- pgbackrest --stanza=fastpoll check" > "$LOGS/pitr-check-$1.log" 2>&1 \
        || { cat "$LOGS/pitr-check-$1.log" >&2; die "$1: pgbackrest check failed"; }
    on "$1" fastpoll-pg-pitr --stop > /dev/null
    on "$1" fastpoll-pg-pitr "'$2'" > "$LOGS/pitr-$1.log" 2>&1 || { cat "$LOGS/pitr-$1.log" >&2; die "$1: fastpoll-pg-pitr failed"; }
    out=$(on "$1" "cd / && runuser -u pgbackrest -- psql -X -t -A -h /var/tmp/fastpoll-pitr/run -p 5499 -U postgres -d fastpoll \
        -c \"SELECT string_agg(text, ',' ORDER BY id) FROM messages WHERE user_id = $3\"")
    on "$1" fastpoll-pg-pitr --stop > /dev/null
    echo "$out"
}

sc_postgres_ha() {
    local primary standby i u_pitr t_mark out t_kill t_new new_primary gap
    primary=$(pg_primary)
    [ "$primary" != - ] || die "no PostgreSQL primary"
    if [ "$primary" = fp-db1 ]; then standby=fp-app2; else standby=fp-db1; fi
    expect "$(patroni_role "$standby")" replica "$standby's Patroni role"
    # The standby is the synchronous one: a 201 is on both hosts.
    expect "$(on "$standby" curl -s -m 2 -o /dev/null -w '%{http_code}' "http://${IP[$standby]}:8008/sync")" 200 \
        "$standby is the synchronous standby"
    out=$(pg_sql "$primary" "SHOW synchronous_commit; SHOW synchronous_standby_names;" | paste -sd' ')
    say "primary $primary, synchronous standby $standby ($out)"
    # The first deploy's full backup, and its metric for BackupTooOld.
    out=$(on fp-mon1 cat /var/lib/prometheus/node-exporter/fastpoll_backup.prom | awk '/^fastpoll_backup_last_success_timestamp_seconds/{print $2}')
    [ -n "$out" ] && [ $(( $(date +%s) - out )) -lt 3600 ] || die "no recent fastpoll_backup_last_success_timestamp_seconds on fp-mon1: '$out'"
    # Read whole, then searched: `grep -q` on the pipe would end at the match, and the rest of
    # node_exporter's output (larger than a pipe's buffer) would fail the pipeline with SIGPIPE.
    out=$(on fp-mon1 "curl -fsS http://${IP[fp-mon1]}:9100/metrics") || die "fp-mon1's node_exporter does not answer"
    grep -q '^fastpoll_backup_last_success_timestamp_seconds{' <<< "$out" \
        || die "node_exporter on fp-mon1 does not serve the backup metric"
    # The second repository, on fp-data1: encrypted (its info file is OpenSSL's salted format, and
    # pgBackRest says aes-256-cbc), its own full backup from the first deploy, WAL pushed to it too.
    out=$(on fp-data1 "runuser -u pgbackrest -- pgbackrest --stanza=fastpoll --output=json info") \
        || die "pgbackrest info failed on fp-data1"
    out=$(python3 -c 'import json, sys; d = json.loads(sys.argv[1])[0]
print(len(d["backup"]), " ".join(sorted({r["cipher"] for r in d["repo"]})))' "$out") \
        || die "fp-data1's pgbackrest info does not parse"
    [[ "$out" =~ ^[1-9][0-9]*\ aes-256-cbc$ ]] || die "fp-data1's repository: backups and cipher '$out', want 1+ and aes-256-cbc"
    expect "$(on fp-data1 "head -c 8 /var/lib/pgbackrest/backup/fastpoll/backup.info")" Salted__ \
        "fp-data1's backup.info is encrypted"
    on fp-data1 "runuser -u pgbackrest -- pgbackrest --stanza=fastpoll check" > "$LOGS/repo2-check.log" 2>&1 \
        || { cat "$LOGS/repo2-check.log"; die "pgbackrest check failed on fp-data1 (WAL does not reach the second repository)"; }
    say "second repository on fp-data1: $out (backups, cipher), WAL reaches it"

    # ---- 1. point-in-time restore from each repository ----
    u_pitr=$((RANDOM % 9000 + 60000))
    expect "$(publish fp-data1 "$u_pitr" "pitr A")" 201 "publish A"
    sleep 1
    t_mark=$(pg_sql "$primary" "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || '+00'")
    sleep 1
    expect "$(publish fp-data1 "$u_pitr" "pitr B")" 201 "publish B"
    for n in fp-mon1 fp-data1; do
        expect "$(pitr_messages "$n" "$t_mark" "$u_pitr")" "pitr A" \
            "$n: the restored database's messages of user $u_pitr (A before $t_mark, B after)"
    done
    phase "point-in-time restore to $t_mark on fp-mon1 and from the encrypted repository on fp-data1: A there, B not"

    # ---- 2. the primary killed under load ----
    local users=() paths=() u
    for i in 0 1 2 3; do users+=($((RANDOM % 9000 + 61000 + i * 10000))); done
    for i in 0 1 2; do
        u=$((RANDOM % 9000 + 20000 + i * 10000))
        expect "$(publish fp-data1 "$u" "polled during the failover")" 201 "publish before the failover"
        paths+=("$(signed "/Poll/getMessages?user_id=$u")")
    done
    drill_load pg_ha_load.py pgha 120 "$(IFS=,; echo "${users[*]}")" "$(printf '%s\n' "${paths[@]}" | paste -sd'|')"
    sleep 5
    kill -0 "$DRILL_PID" 2>/dev/null || { cat "$LOGS/pgha-load.log"; die "the load generator ended early"; }
    t_kill=$(date +%s.%N)
    echo "kill $t_kill" >> "$RUN/pgha-events"
    # The host's database processes die at once (Patroni and every PostgreSQL process, one
    # kill(1)); masked first, so systemd's Restart= does not bring Patroni back before its leader
    # key expires. Not `systemctl kill`: in the test's containers it fails on the unit's other
    # processes (EIO) after killing Patroni alone, and PostgreSQL goes on without it.
    on "$primary" 'systemctl mask --runtime --quiet patroni.service &&
        kill -KILL $(pgrep -f "^/usr/bin/python3 /usr/bin/patroni") $(pgrep -u postgres -x postgres) &&
        sleep 0.5 && ! pgrep -u postgres -x postgres > /dev/null' \
        || die "cannot kill $primary's PostgreSQL"
    new_primary=-
    for i in $(seq 1 120); do
        [ "$(patroni_role "$standby")" = primary ] && { new_primary=$standby; break; }
        sleep 0.5
    done
    [ "$new_primary" = "$standby" ] || die "$standby did not become the primary within 60 s"
    t_new=$(date +%s.%N)
    echo "promoted $t_new" >> "$RUN/pgha-events"
    sleep 8
    drill_stop pgha
    pg_sql "$new_primary" "SELECT user_id, text FROM messages WHERE user_id IN ($(IFS=,; echo "${users[*]}"))" \
        | tr '|' '\t' > "$RUN/pgha-stored.tsv" || die "cannot read the messages back from $new_primary"
    "$REPO/.venv/bin/python" "$HERE/pg_ha_load.py" --check "$RUN/pgha-load.json" --events "$RUN/pgha-events" \
        --stored "$RUN/pgha-stored.tsv" --max-gap 30 > "$RUN/pgha-verdict.txt" 2>&1 \
        || { cat "$RUN/pgha-verdict.txt"; die "PostgreSQL failover under load"; }
    sed 's/^/  /' "$RUN/pgha-verdict.txt"
    gap=$(awk -v a="$t_kill" -v b="$t_new" 'BEGIN{printf "%.1f", b - a}')

    # The old primary comes back as the synchronous standby (pg_rewind if its WAL went further).
    on "$primary" 'systemctl unmask --runtime --quiet patroni.service && systemctl start patroni.service' \
        || die "cannot start $primary's Patroni again"
    for i in $(seq 1 120); do
        [ "$(on "$primary" curl -s -m 2 -o /dev/null -w '%{http_code}' "http://${IP[$primary]}:8008/sync" 2>/dev/null)" = 200 ] && break
        [ "$i" -lt 120 ] || die "$primary is not the synchronous standby within 60 s of its start"
        sleep 0.5
    done
    on fp-mon1 "runuser -u pgbackrest -- pgbackrest --stanza=fastpoll check" > "$LOGS/pgha-check.log" 2>&1 \
        || { cat "$LOGS/pgha-check.log"; die "WAL from the new primary does not reach the repository"; }
    phase "PostgreSQL primary $primary killed under load: $new_primary primary after ${gap} s; $(head -1 "$RUN/pgha-verdict.txt"); $primary back as the synchronous standby, WAL archived from $new_primary"

    archive_outage "$new_primary"
}

# archive_outage PRIMARY: step 3, the repository's server stopped while PRIMARY writes.
archive_outage() {
    local primary=$1 failed0 failed last i u t_stop t_back ready alert
    # archive-async: archive_command hands the segment to pgBackRest's queue process.
    on "$primary" "grep -qx 'archive-async=y' /etc/pgbackrest.conf" || die "$primary's pgBackRest does not archive asynchronously"
    failed0=$(pg_sql "$primary" "SELECT failed_count FROM pg_stat_archiver")
    on fp-mon1 systemctl stop pgbackrest.service
    t_stop=$(date +%s)
    u=$((RANDOM % 9000 + 60000))
    for i in 1 2 3; do
        expect "$(publish fp-data1 "$u" "written while the repository is down $i")" 201 "publish $i with the repository down"
        last=$(pg_sql "$primary" "SELECT pg_walfile_name(pg_switch_wal())")
    done
    # pgBackRest's archive-push waits up to archive-timeout (60 s) for its queue process to push.
    failed=$failed0
    for i in $(seq 1 90); do
        failed=$(pg_sql "$primary" "SELECT failed_count FROM pg_stat_archiver")
        [ "$failed" -gt "$failed0" ] && break
        sleep 1
    done
    [ "$failed" -gt "$failed0" ] || { on fp-mon1 systemctl start pgbackrest.service; die "no failed archive command within 90 s of stopping the repository's server"; }
    ready=$(on "$primary" "ls /var/lib/postgresql/15/fastpoll/pg_wal/archive_status/ | grep -c '\.ready\$'" || true)
    [ "${ready:-0}" -ge 1 ] || { on fp-mon1 systemctl start pgbackrest.service; die "no WAL segment waits for archiving on $primary (ready: ${ready:-0})"; }
    expect "$(publish fp-data1 "$u" "written while archiving fails")" 201 "a publish while archiving fails"
    # Prometheus sees it: WalArchivingFailing for this host, pending (its `for` is 5 min) after a
    # scrape and an evaluation (10 s each until the monitoring scenario shortens them).
    alert=""
    for i in $(seq 1 60); do
        alert=$(prom_query "ALERTS{alertname=\"WalArchivingFailing\",host=\"$primary\"}" 2>/dev/null) && [ -n "$alert" ] && break
        sleep 1
    done
    [ -n "$alert" ] || { on fp-mon1 systemctl start pgbackrest.service; die "WalArchivingFailing is not pending for $primary within 60 s of a failed archive command"; }
    on fp-mon1 systemctl start pgbackrest.service
    t_back=$(date +%s)
    # The archiver retries once a minute at most: the queue drains within two.
    for i in $(seq 1 150); do
        [ "$(pg_sql "$primary" "SELECT last_archived_wal >= '$last' FROM pg_stat_archiver")" = t ] && break
        [ "$i" -lt 150 ] || die "$last is not archived 150 s after the repository's server came back"
        sleep 1
    done
    on fp-mon1 "runuser -u pgbackrest -- pgbackrest --stanza=fastpoll check" > "$LOGS/archive-outage-check.log" 2>&1 \
        || { cat "$LOGS/archive-outage-check.log"; die "pgbackrest check after the archiving outage"; }
    # PostgreSQL logs to Patroni's journal; pgBackRest's warning of a dropped queue goes there.
    if on "$primary" "journalctl -u patroni --since=@$t_stop | grep -q 'dropped WAL file'"; then
        die "$primary dropped WAL during a short outage"
    fi
    phase "backup host's pgBackRest stopped $((t_back - t_stop)) s under writes: $((failed - failed0)) failed archive commands, ${ready} segments waiting on $primary, WalArchivingFailing pending, publishes 201; archived up to $last $(( $(date +%s) - t_back )) s after it came back"
}
