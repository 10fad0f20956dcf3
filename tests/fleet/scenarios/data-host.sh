# shellcheck shell=bash disable=SC2154  # redis_pass: set by run.sh
# The fleet test's data-host scenario: the data host binds privately, Redis wants its password, one
# memcached list. Sourced by tests/fleet/run.sh (which runs sc_data_host as the row data-host); it
# uses lib.sh's helpers and the variables of the run.

sc_data_host() {
# ---- 5. the data host: private binds, the Redis password, one memcached list everywhere --------
on fp-data1 bash -s "${IP[fp-data1]}" "$redis_pass" <<'EOF' || die "fp-data1: service check failed"
set -euo pipefail
ip=$1 pass=$2
listen=$(ss -ltnH | awk '{print $4}')
for port in 11211 6379 8000; do
    got=$(echo "$listen" | grep ":$port\$" | sort | tr '\n' ' ')
    [ "$got" = "$ip:$port " ] || { echo "port $port listens on '$got', want only $ip:$port"; exit 1; }
done
out=$(redis-cli -h "$ip" PING 2>&1)
case "$out" in *NOAUTH*) ;; *) echo "redis answered without the password: $out"; exit 1;; esac
[ "$(redis-cli -h "$ip" --user fastpoll --no-auth-warning -a "$pass" PING)" = PONG ] || { echo "redis refuses the password"; exit 1; }
[ "$(stat -c '%a %U %G' /etc/fastpoll/redis.pass)" = "640 root fastpoll" ] || { echo "redis.pass mode/owner wrong"; exit 1; }
EOF
servers=""
for n in "${FLEET[@]}"; do
    line=$(on "$n" grep '^servers' /etc/fastpoll/fastpoll.ini | tr '\n' ' ')
    [ -z "$servers" ] || [ "$line" = "$servers" ] || die "$n: memcached list differs: '$line' vs '$servers'"
    servers=$line
done
# Sorted by inventory name: fp-data1 before fp-poll2.
expect "$servers" "servers = ${IP[fp-data1]}:11211 servers = ${IP[fp-poll2]}:11211 " "memcached list"
say "memcached, redis and the app listen on the private address only; redis wants its password; one list: $servers"
}
