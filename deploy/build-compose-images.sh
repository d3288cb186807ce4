#!/usr/bin/env bash
# Builds every image deploy/compose.local.yaml names, on this machine, from the Debian base
# deploy/build-image.sh makes (no registry is reached; pip, npm's packages and Debian's come from the
# machine's mirrors and the repository's locks):
#   localhost/billing:dev            the roles (deploy/Dockerfile, default target)
#   localhost/billing-console:dev    the console (deploy/Dockerfile --target console)
#   localhost/billing-azurite:dev    Azurite from node_modules (`npm ci` first: make setup runs it)
#   localhost/billing-postgres:dev   PostgreSQL 15 from Debian
# Usage: deploy/build-compose-images.sh   (prints the tags when done)
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/deploy/containers.conf}"
base="${BILLING_BASE_IMAGE:-localhost/billing-base:bookworm-updates}"

bash deploy/build-image.sh localhost/billing:dev roles
bash deploy/build-image.sh localhost/billing-console:dev console
[ -f node_modules/azurite/package.json ] || { echo "node_modules/azurite is missing: run npm ci" >&2; exit 1; }
for image in azurite postgres; do
    podman build --quiet --format docker --network host --build-arg "BASE=$base" \
        --ignorefile "deploy/images/$image.Dockerfile.dockerignore" -f "deploy/images/$image.Dockerfile" \
        -t "localhost/billing-$image:dev" . >/dev/null
    echo "localhost/billing-$image:dev"
done
