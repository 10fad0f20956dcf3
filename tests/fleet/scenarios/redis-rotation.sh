# shellcheck shell=bash disable=SC2154,SC2034  # redis_pass: set by run.sh; u: by redis-backend, which runs first; first_url: read by ab_rounds
# The fleet test's redis-rotation scenario: the Redis password rotated in two runs under ab rounds,
# the cache kept (needs redis-backend). Sourced by tests/fleet/run.sh (which runs sc_redis_rotation
# as the row redis-rotation); it uses lib.sh's helpers and the variables of the run.

sc_redis_rotation() {
# ---- 17. Redis password rotation under load, the cache kept ------------------------------------------
# docs/runbook.md: (1) Redis takes the new password and the old one (ACL SETUSER, no restart), the
# pollers and the app restart onto the new one; (2) the old one is dropped (ACL SETUSER: no
# connection of a poll server is dropped, their logs say). ab rounds
# through both pollers overlap both phases: 0 failed. A key written before the rotation and not
# polled during it is still a hit after, and Redis kept its run_id (never restarted).
new_pass=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
kept_u=$((u + 1))
expect "$(publish fp-data1 "$kept_u" "kept through the rotation")" 201 "publish before the Redis rotation"
rot_u=$((u + 2))
expect "$(publish fp-data1 "$rot_u" "polled through the rotation")" 201 "publish before the Redis rotation"
run_id=$(redis_cli -a "$redis_pass" INFO server | tr -d '\r' | sed -n 's/^run_id://p')
[ -n "$run_id" ] || die "no run_id from Redis"
grep -v '^fastpoll_redis_password' "$RUN/secrets.yml" > "$RUN/secrets-redis.yml"
printf 'fastpoll_redis_password: "%s"\n' "$new_pass" >> "$RUN/secrets-redis.yml"
printf 'fastpoll_redis_previous_passwords: ["%s"]\n' "$redis_pass" > "$RUN/redis-prev.yml"
rounds=0 per_phase=""
first_url=$(poll_url fp-data1 "$rot_u")
assert_all_routes
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" -e "@$RUN/secrets-redis.yml" \
    -e "@$RUN/redis-prev.yml" -e "fastpoll_release_dir=$FASTPOLL_BUILD_DIR/current" -e fastpoll_cache_ttl=299 \
    -e fastpoll_cache_backend=redis --limit 'pollers:app:redis' --tags config,redis,app,pollers,exporters \
    > "$LOGS/ansible-redis-rotation-1.log" 2>&1 &
rot_pid=$!
ab_rounds "$rot_pid" "Redis password rotation"
wait "$rot_pid" || { tail -40 "$LOGS/ansible-redis-rotation-1.log"; die "Redis rotation phase 1 failed"; }
expect "$(redis_cli -a "$redis_pass" PING)" PONG "the old Redis password during the rotation"
t_p2=$(date +%s)
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" -e "@$RUN/secrets-redis.yml" \
    -e "fastpoll_release_dir=$FASTPOLL_BUILD_DIR/current" -e fastpoll_cache_ttl=299 -e fastpoll_cache_backend=redis \
    --limit redis --tags redis > "$LOGS/ansible-redis-rotation-2.log" 2>&1 &
rot_pid=$!
ab_rounds "$rot_pid" "Redis password rotation"
wait "$rot_pid" || { tail -40 "$LOGS/ansible-redis-rotation-2.log"; die "Redis rotation phase 2 failed"; }
# Dropping the old password dropped no connection (ACL SETUSER; ACL LOAD would drop them all, and
# every poll in flight would fall back to the app at once).
for n in "${POLLERS[@]}"; do
    lost=$(on "$n" "journalctl --since=@$t_p2 -u 'fastpoll-poller@*' --no-pager -o cat | grep -c 'connection lost'" || true)
    [ "${lost:-0}" = 0 ] || die "dropping the old Redis password dropped $n's poll servers' connections ($lost lost)"
done
expect "$(redis_cli -a "$new_pass" PING)" PONG "the new Redis password"
case "$(redis_cli -a "$redis_pass" PING 2>&1)" in *WRONGPASS*|*NOAUTH*|*invalid*) ;; *) die "Redis still takes the old password";; esac
expect "$(redis_cli -a "$new_pass" INFO server | tr -d '\r' | sed -n 's/^run_id://p')" "$run_id" "Redis run_id (not restarted)"
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$kept_u")" "200 cache" "a key written before the rotation"
grep -q 'kept through the rotation' "$RUN/body" || die "the kept key's answer lacks its message"
expect "$(http GET fp-poll2 "/Poll/getMessages?user_id=$((u + 3))")" "200 app" "a miss after the rotation"
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$((u + 3))")" "200 cache" "filled with the new password"
phase "Redis password rotation (both, then the new one only) under load: $rounds ab rounds (per phase:$per_phase), 0 failed; no poll server connection dropped with the old password; cache kept (same run_id, an old key still a hit)"
}
