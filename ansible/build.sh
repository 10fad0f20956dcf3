#!/bin/bash
# Build the deployment artifacts once, on the control node (Debian 12, like the hosts):
#   - poll_server/build/poll_server (make -C poll_server), copied as-is to every poller;
#   - ansible/build/wheelhouse/: the fallback app and all its dependencies as wheels, pylibmc
#     compiled from source against Debian's libmemcached 1.1.4 (the same library the hosts get
#     from apt, so its ketama equals the poll server's). Hosts install it with --no-index.
# The wheelhouse is rebuilt only when fallback_app/ changed, so a second deploy copies nothing.
# Needs: build-essential pkg-config libevent-dev libmemcached-dev libhiredis-dev libinih-dev
# python3-venv python3-dev (the Makefile's `make deps` installs them).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${FASTPOLL_BUILD_DIR:-$here/build}
python=${FASTPOLL_BUILD_PYTHON:-/usr/bin/python3}

# FASTPOLL_BUILD_POLL_SERVER=0 skips the binary (when poll_server_binary_src points elsewhere).
if [ "${FASTPOLL_BUILD_POLL_SERVER:-1}" != 0 ]; then
    make -s -C "$repo/poll_server"
    "$repo/poll_server/build/poll_server" -V >/dev/null
fi

# The Debian python the hosts run, so wheels match their interpreter (cp311).
"$python" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
    || { echo "build.sh: $python is not Python 3.11 (Debian 12's)" >&2; exit 1; }

src_hash=$(cd "$repo" && find fallback_app -path '*/tests' -prune -o \
              \( -name '*.py' -o -name pyproject.toml \) -type f -print \
          | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
wheelhouse=$out/wheelhouse
if [ -f "$wheelhouse/.source-hash" ] && [ "$(cat "$wheelhouse/.source-hash")" = "$src_hash" ]; then
    echo "build.sh: wheelhouse up to date ($wheelhouse)"
    exit 0
fi

mkdir -p "$out"
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
echo "build.sh: wheelhouse built: $(ls "$wheelhouse" | tr '\n' ' ')"
