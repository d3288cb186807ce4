#!/usr/bin/env bash
# Install the PostgreSQL server binaries the tests use (Debian/Ubuntu, as root); idempotent.
# The tests start their own throw-away cluster, so the distribution's default cluster is left stopped.
set -euo pipefail

if compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
    exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo)
fi

# Keep the package's maintainer scripts from starting the default cluster (policy-rc.d 101: deny).
policy=/usr/sbin/policy-rc.d
own_policy=false
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
    "${sudo[@]}" chmod 755 "$policy"
    own_policy=true
fi
cleanup() {
    if "$own_policy"; then
        "${sudo[@]}" rm -f "$policy"
    fi
}
trap cleanup EXIT

"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null

# Should a cluster have started anyway, stop it: the tests run their own.
if command -v pg_lsclusters >/dev/null; then
    pg_lsclusters --no-header 2>/dev/null | while read -r version cluster _; do
        "${sudo[@]}" pg_ctlcluster "$version" "$cluster" stop >/dev/null 2>&1 || true
    done
fi

compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || { echo "PostgreSQL install failed: no initdb" >&2; exit 1; }
