# shellcheck shell=bash disable=SC2154  # seed_user: set by run.sh
# The fleet test's edge scenario: TLS and HTTP/2, HSTS, /healthz following the pollers, log
# rotation, the firewall. Sourced by tests/fleet/run.sh (which runs sc_edge as the row edge); it
# uses lib.sh's helpers and the variables of the run.

sc_edge() {
# ---- 10. the edge: TLS, the LB health check, the firewall ------------------------------------------
for n in "${POLLERS[@]}"; do
    assert_route "${IP[$n]}"
    v=$(curl -sS -m 10 --cacert "$RUN/tls.pem" --http2 -o "$RUN/body" -w '%{http_code} %{http_version}' \
        "https://${IP[$n]}$(signed "/Poll/getMessages?user_id=$seed_user")") || die "$n: TLS request failed"
    expect "$v" "200 2" "$n: a poll over TLS with the test certificate, HTTP/2"
    grep -q 'hello' "$RUN/body" || die "$n: TLS answer lacks the message"
    v=$(curl -sS -m 10 --cacert "$RUN/tls.pem" -D- -o /dev/null "https://${IP[$n]}/healthz" \
        | tr -d '\r' | grep -i '^strict-transport-security:') || v=""
    expect "$v" "strict-transport-security: max-age=63072000" "$n: HSTS over TLS"
    v=$(curl -sS -m 10 -D- -o /dev/null "http://${IP[$n]}/healthz" | tr -d '\r' | grep -ic '^strict-transport-security:') || v=0
    expect "$v" 0 "$n: no HSTS over plain HTTP"
done
# /healthz follows this host's pollers: healthy with every app down, 503 with its pollers down.
for a in "${APPS[@]}"; do on "$a" systemctl stop fastpoll-app; done
expect "$(http GET fp-poll1 /healthz | cut -d' ' -f1)" 200 "fp-poll1: /healthz with every app host down"
for a in "${APPS[@]}"; do on "$a" systemctl start fastpoll-app; done
on fp-poll1 systemctl stop fastpoll-poller@8101 fastpoll-poller@8102
expect "$(http GET fp-poll1 /healthz | cut -d' ' -f1)" 503 "fp-poll1: /healthz with its pollers down"
expect "$(http GET fp-poll2 /healthz | cut -d' ' -f1)" 200 "fp-poll2: /healthz while fp-poll1's pollers are down"
on fp-poll1 systemctl start fastpoll-poller@8101 fastpoll-poller@8102
for _ in $(seq 1 20); do [ "$(http GET fp-poll1 /healthz | cut -d' ' -f1)" = 200 ] && break; sleep 0.5; done
expect "$(http GET fp-poll1 /healthz | cut -d' ' -f1)" 200 "fp-poll1: /healthz with its pollers back"
app_up
# Log rotation: logrotate runs hourly (the size limit); a forced rotation makes nginx reopen its
# access log, and the next answer is logged in the new file (nginx flushes it within 5 s).
on fp-poll1 systemctl show -p TimersCalendar logrotate.timer | grep -q '\*:00:00' || die "fp-poll1: logrotate is not hourly"
on fp-poll1 logrotate -f /etc/logrotate.d/nginx || die "fp-poll1: logrotate failed"
on fp-poll1 test -e /var/log/nginx/fastpoll.access.log.1 || die "fp-poll1: the access log was not rotated"
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$seed_user" | cut -d' ' -f1)" 200 "a poll after the rotation"
for _ in $(seq 1 16); do on fp-poll1 test -s /var/log/nginx/fastpoll.access.log && break; sleep 0.5; done
on fp-poll1 grep -q "user_id=$seed_user" /var/log/nginx/fastpoll.access.log || die "fp-poll1: nginx did not reopen its access log"
# The firewall (from inside the test network only): PostgreSQL answers app hosts, not a poller;
# memcached answers a poller, not the database host.
port_open fp-data1 "${IP[fp-db1]}" 5432 || die "fp-data1 (app) cannot reach PostgreSQL"
if port_open fp-poll1 "${IP[fp-db1]}" 5432; then die "fp-poll1 (not an app host) reaches PostgreSQL through the firewall"; fi
port_open fp-poll1 "${IP[fp-data1]}" 11211 || die "fp-poll1 cannot reach memcached on fp-data1"
if port_open fp-db1 "${IP[fp-data1]}" 11211; then die "fp-db1 reaches memcached through the firewall"; fi
phase "edge: TLS + HTTP/2 with the test certificate, HSTS over TLS only, access log rotated and reopened, /healthz follows the pollers, firewall closes 5432 and 11211 to outsiders"
}
