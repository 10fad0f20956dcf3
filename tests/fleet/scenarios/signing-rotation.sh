# shellcheck shell=bash
# The fleet test's signing-rotation scenario: the signing key rotated in three runs under ab rounds:
# 0 non-2xx. Sourced by tests/fleet/run.sh (which runs sc_signing_rotation as the row signing-
# rotation); it uses lib.sh's helpers and the variables of the run.

sc_signing_rotation() {
# ---- 13. signing-key rotation in two phases under load -------------------------------------------
new_key=$("$REPO/.venv/bin/python" -c 'import secrets; print(secrets.token_hex(32))')
old_key=$(cat "$RUN/signing.key")
grep -v '^fastpoll_signing_secrets' "$RUN/secrets.yml" > "$RUN/secrets-rot.yml"
rot_u=$((RANDOM % 9000 + 80000))
expect "$(publish fp-data1 "$rot_u" "rotation")" 201 "publish before the rotation"
rounds=0 per_phase=""
first_url=$(poll_url fp-data1 "$rot_u")
for rot_phase in 1 2; do
    # 1: every poller accepts the new key (the app still signs with the old one, listed first);
    # 2: the app signs with the new one.
    printf 'fastpoll_signing_secrets: ["%s", "%s"]\nfastpoll_signing_current: %s\n' "$old_key" "$new_key" \
        "$((rot_phase - 1))" > "$RUN/rot.yml"
    assert_all_routes
    "$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" -e "@$RUN/secrets-rot.yml" \
        -e "@$RUN/rot.yml" -e "fastpoll_release_dir=$FASTPOLL_BUILD_DIR/current" -e fastpoll_cache_ttl=299 \
        --limit 'pollers:app' --tags config,app,pollers > "$LOGS/ansible-rotation-$rot_phase.log" 2>&1 &
    rot_pid=$!
    ab_rounds "$rot_pid" "signing-key rotation"
    wait "$rot_pid" || { tail -40 "$LOGS/ansible-rotation-$rot_phase.log"; die "rotation phase $rot_phase failed"; }
    first_url=$(poll_url fp-app2 "$rot_u")
done
# The app now signs with the new key: a URL it issues verifies under the new key alone.
"$REPO/.venv/bin/python" - "$new_key" "$first_url" <<'PY' || die "a URL issued after phase 2 is not signed with the new key"
import sys, time
from fastpoll_app.keys import derive_key
from fastpoll_app.signing import verify
key, url = sys.argv[1].encode(), sys.argv[2].encode()
path, query = url.split(b"?", 1)
uid = query.split(b"&")[0]
k = derive_key(b"/Poll", path[len(b"/Poll"):] + b"?" + uid, [b"user_id"])
sys.exit(0 if verify([key], k, query, time.time()) else 1)
PY
# 3, after the longest URL lifetime in production: the old key is dropped.
echo "$new_key" > "$RUN/signing.key"
{ cat "$RUN/secrets-rot.yml"; printf 'fastpoll_signing_secrets: ["%s"]\n' "$new_key"; } > "$RUN/secrets.yml"
assert_all_routes
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" "${EXTRA[@]}" -e fastpoll_cache_ttl=299 \
    --limit 'pollers:app' --tags config,app,pollers > "$LOGS/ansible-rotation-3.log" 2>&1 &
rot_pid=$!
ab_rounds "$rot_pid" "signing-key rotation"
wait "$rot_pid" || { tail -40 "$LOGS/ansible-rotation-3.log"; die "rotation phase 3 failed"; }
expect "$(http GET fp-poll1 "/Poll/getMessages?user_id=$rot_u" | cut -d' ' -f1)" 200 "a URL signed with the new key"
phase "signing-key rotation (accept the new, sign with it, drop the old) under load: $rounds ab rounds (per phase:$per_phase), 0 non-2xx"
}
