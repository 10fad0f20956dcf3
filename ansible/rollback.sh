#!/bin/bash
# Roll the fleet back to the release deployed before the current one, in one command:
#
#   ansible/rollback.sh -i inventories/fleet/hosts.yml [--ask-vault-pass] [more ansible-playbook args]
#
# build/current is re-pointed at the release listed before it in build/releases/HISTORY (its
# artifacts are still there, checked against its SHA256SUMS by the play), then site.yml deploys it
# the usual way: pollers one host and one instance at a time, app hosts one at a time. A failed run
# can simply be run again with ansible-playbook: build/current already names the old release.
# FASTPOLL_BUILD_DIR as for build.sh; FASTPOLL_ROLLBACK_TO=<id> picks another listed release.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${FASTPOLL_BUILD_DIR:-$here/build}
history=$out/releases/HISTORY
[ -f "$history" ] && [ -L "$out/current" ] || { echo "rollback.sh: no releases in $out (run build.sh)" >&2; exit 1; }
current=$(basename "$(readlink "$out/current")")
if [ -n "${FASTPOLL_ROLLBACK_TO:-}" ]; then
    target=$FASTPOLL_ROLLBACK_TO
else
    # The last release listed before the current one's last appearance.
    target=$(awk -v c="$current" '{a[NR] = $0} END {for (i = NR; i > 1; i--) if (a[i] == c) {print a[i-1]; exit}}' "$history")
fi
[ -n "$target" ] && [ "$target" != "$current" ] || { echo "rollback.sh: no release before $current in $history" >&2; exit 1; }
[ -f "$out/releases/$target/SHA256SUMS" ] || { echo "rollback.sh: $out/releases/$target is gone" >&2; exit 1; }
(cd "$out/releases/$target" && sha256sum --quiet -c SHA256SUMS) || { echo "rollback.sh: $target fails its checksums" >&2; exit 1; }
echo "rollback.sh: $current -> $target"
ln -sfn "releases/$target" "$out/current"
cd "$here"
exec ansible-playbook site.yml -e "fastpoll_release_dir=$out/current" -e fastpoll_rollback=true "$@"
