#!/bin/bash
# Build one release of the deployment artifacts on the control node (Debian 12, like the hosts):
#   - poll_server/build/poll_server (make -C poll_server), copied as-is to every poller;
#   - the fallback app and all its dependencies as wheels, pylibmc compiled from source against
#     Debian's libmemcached 1.1.4 (the same library the hosts get from apt, so its ketama equals
#     the poll server's). Hosts install them with --no-index.
# Each release is a directory build/releases/<id>/ (poll_server, wheelhouse/, RELEASE, SHA256SUMS);
# build/current points at the newest, build/releases/HISTORY lists them oldest first. The play
# checks SHA256SUMS before it copies anything; ansible/rollback.sh re-points build/current at the
# previous release and deploys it (docs/deploy.md).
# The wheelhouse is rebuilt only when fallback_app/ changed, so a second build is a no-op.
# Needs: build-essential pkg-config libevent-dev libmemcached-dev libhiredis-dev libinih-dev
# python3-venv python3-dev (the Makefile's `make deps` installs them).
#
# Environment: FASTPOLL_BUILD_DIR (default ansible/build), FASTPOLL_BUILD_PYTHON,
# FASTPOLL_POLL_SERVER_BIN (package this binary instead of building poll_server/).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${FASTPOLL_BUILD_DIR:-$here/build}
python=${FASTPOLL_BUILD_PYTHON:-/usr/bin/python3}

if [ -n "${FASTPOLL_POLL_SERVER_BIN:-}" ]; then
    bin=$FASTPOLL_POLL_SERVER_BIN
else
    make -s -C "$repo/poll_server"
    bin=$repo/poll_server/build/poll_server
fi
"$bin" -V >/dev/null

# The Debian python the hosts run, so wheels match their interpreter (cp311).
"$python" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
    || { echo "build.sh: $python is not Python 3.11 (Debian 12's)" >&2; exit 1; }

src_hash=$(cd "$repo" && find fallback_app -path '*/tests' -prune -o \
              \( -name '*.py' -o -name pyproject.toml \) -type f -print \
          | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
wheelhouse=$out/wheelhouse
mkdir -p "$out/releases"
if [ -f "$wheelhouse/.source-hash" ] && [ "$(cat "$wheelhouse/.source-hash")" = "$src_hash" ]; then
    echo "build.sh: wheelhouse up to date ($wheelhouse)"
else
    tmp=$(mktemp -d "$out/.wheelhouse.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    "$python" -m venv "$tmp/venv"
    "$tmp/venv/bin/pip" install -q --disable-pip-version-check --upgrade pip wheel
    # Build from a copy so no build/ or egg-info lands in the source tree.
    cp -r "$repo/fallback_app" "$tmp/src"
    rm -rf "$tmp/src"/*.egg-info "$tmp/src/build"
    "$tmp/venv/bin/pip" wheel -q --disable-pip-version-check --no-binary pylibmc "$tmp/src" -w "$tmp/wheels"
    echo "$src_hash" > "$tmp/wheels/.source-hash"
    rm -rf "$wheelhouse"
    mv "$tmp/wheels" "$wheelhouse"
    rm -rf "$tmp"
    trap - EXIT
    echo "build.sh: wheelhouse built: $(ls "$wheelhouse" | tr '\n' ' ')"
fi

# The release: its id is the poll server's version and a hash of both artifacts, so the same
# inputs give the same release and any change gives a new one.
version=$("$bin" -V 2>&1 | awk '{print $NF; exit}' | tr -c 'A-Za-z0-9.+_\n-' '_')
art_hash=$( { sha256sum < "$bin"; (cd "$wheelhouse" && ls ./*.whl | LC_ALL=C sort | xargs sha256sum); } \
            | sha256sum | cut -c1-12)
id="$version-$art_hash"
rel=$out/releases/$id
if [ ! -f "$rel/SHA256SUMS" ]; then
    tmp=$(mktemp -d "$out/releases/.new.XXXXXX")
    install -m 0755 "$bin" "$tmp/poll_server"
    mkdir "$tmp/wheelhouse"
    cp "$wheelhouse"/*.whl "$tmp/wheelhouse/"
    echo "$id" > "$tmp/RELEASE"
    (cd "$tmp" && find . -type f ! -name SHA256SUMS | LC_ALL=C sort | sed 's|^\./||' | xargs sha256sum > SHA256SUMS)
    rm -rf "$rel"
    mv "$tmp" "$rel"
fi
touch "$out/releases/HISTORY"
if [ "$(tail -n1 "$out/releases/HISTORY")" != "$id" ]; then
    echo "$id" >> "$out/releases/HISTORY"
fi
ln -sfn "releases/$id" "$out/current"
echo "build.sh: release $id ($rel), build/current -> it"
