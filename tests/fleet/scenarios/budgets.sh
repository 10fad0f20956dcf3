# shellcheck shell=bash
# The fleet test's budgets scenario: an inventory of 6,000 poll server instances is refused by the
# connection budget check (role budgets) before any host changes, with the numbers in its message.
# Sourced by tests/fleet/run.sh (which runs sc_budgets as the row budgets); it uses lib.sh's
# helpers and the variables of the run.

sc_budgets() {
# ---- connection budgets: an inventory whose clients would overrun memcached is refused ----------
# before any host changes (role budgets, the first play of site.yml).
local out rc=0
"$ANSIBLE_BIN/ansible-playbook" -i "$RUN/inventory.yml" "$REPO/ansible/site.yml" "${EXTRA[@]}" \
    -e poll_server_instances=3000 > "$LOGS/ansible-budgets.log" 2>&1 || rc=$?
[ "$rc" != 0 ] || die "an inventory with 6,000 poll server instances was deployed"
out=$(grep -o '[0-9]* poll server instances on [0-9]* pollers[^(]*(6000 x 1 + [^)]*)' "$LOGS/ansible-budgets.log" | head -1)
case "$out" in
    "6000 poll server instances on 2 pollers"*"need 6"*"connections per memcached node (6000 x 1 +"*"memcached_max_connections 4096)") ;;
    *) tail -30 "$LOGS/ansible-budgets.log"; die "the refusal does not name the numbers: $out" ;;
esac
grep -q 'changed=[1-9]' "$LOGS/ansible-budgets.log" && die "the refused run changed a host"
grep -q '^TASK \[fastpoll_config' "$LOGS/ansible-budgets.log" && die "the refused run went past the budget check"
say "$out"
phase "budgets: 6,000 poll server instances refused before any change, with the numbers"
}
