# shellcheck shell=bash disable=SC2154  # redis_pass: set by run.sh
# The fleet test's redis-backend scenario: the cache backend switched to Redis: publish -> hit, miss
# -> fill -> hit. Sourced by tests/fleet/run.sh (which runs sc_redis_backend as the row redis-
# backend); it uses lib.sh's helpers and the variables of the run.

sc_redis_backend() {
# ---- 16. switch the cache backend to Redis ------------------------------------------------------
# fastpoll.ini changes: the app restarts, the pollers restart one by one (only they read it).
playbook redis-backend -e fastpoll_cache_backend=redis -e fastpoll_cache_ttl=299 --limit 'pollers:app' --tags config,app,pollers
u=$((RANDOM % 9000 + 40000))
expect "$(publish fp-data1 "$u" "hello redis")" 201 "publish (redis)"
for n in "${POLLERS[@]}"; do
    expect "$(http GET "$n" "/Poll/getMessages?user_id=$u")" "200 cache" "$n: hit from Redis"
    grep -q 'hello redis' "$RUN/body" || die "$n: Redis hit lacks the message"
done
val=$(on fp-data1 redis-cli -h "${IP[fp-data1]}" --user fastpoll --no-auth-warning -a "$redis_pass" GET "'/Poll/getMessages?user_id=$u'")
case "$val" in *"hello redis"*) ;; *) die "the key is not in Redis: '$val'";; esac
u=$((u + 1))
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$u")" "200 app" "miss with Redis"
expect "$(http GET fp-poll2 "/Poll/getMessages?user_id=$u")" "200 cache" "hit with Redis after the fill"
phase "Redis backend: publish -> hit on both pollers, miss -> fill -> hit"
}
