#!/usr/bin/env bash
# Builds the billing image with Podman on a machine that can pull no registry image:
#   1. once, a Debian 12 base with Python (debootstrap --variant=minbase from the machine's Debian
#      mirror), its apt sources naming bookworm, bookworm-updates and bookworm-security (the Dockerfile
#      applies their updates), imported as $BILLING_BASE_IMAGE; kept in Podman's storage and reused;
#   2. deploy/Dockerfile FROM that base, with the machine's CA bundle handed to pip as a build secret
#      (never stored in a layer).
# Usage: deploy/build-image.sh [TAG [TARGET]]   (default localhost/billing:dev, the roles' target;
#        TARGET console for `billing serve`; prints the tag when done)
# Where an official Python image can be pulled, build without this script:
#   podman build -f deploy/Dockerfile -t billing .        (or: docker build -f deploy/Dockerfile -t billing .)
set -euo pipefail
cd "$(dirname "$0")/.."

tag="${1:-localhost/billing:dev}"
target="${2:-roles}"
base="${BILLING_BASE_IMAGE:-localhost/billing-base:bookworm-updates}"
ca_bundle="${BILLING_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/deploy/containers.conf}"

debian_mirror() {
    # The machine's own mirror (deb822 or one-line sources), else Debian's.
    local uri
    uri="$(grep -hs -m1 -E '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' || true)"
    [ -n "$uri" ] || uri="$(grep -hs -m1 -E '^deb ' /etc/apt/sources.list | awk '{print $2}' || true)"
    echo "${uri:-http://deb.debian.org/debian}"
}

security_mirror() {
    # The machine's security archive, else Debian's.
    local uri
    uri="$(grep -hs -B3 -A3 -E '^Suites:.*-security' /etc/apt/sources.list.d/*.sources | awk '/^URIs:/ {print $2; exit}' || true)"
    [ -n "$uri" ] || uri="$(grep -hs -m1 -E '^deb .*-security' /etc/apt/sources.list | awk '{print $2}' || true)"
    echo "${uri:-http://deb.debian.org/debian-security}"
}

if ! podman image exists "$base"; then
    root="$(mktemp -d)"
    trap 'rm -rf "$root"' EXIT
    echo "making the base image $base with debootstrap (once; about a minute)" >&2
    mirror="$(debian_mirror)"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$root" "$mirror" >/dev/null
    # Updates and security fixes too, as the official images have them: the Dockerfile upgrades from these.
    rm -f "$root/etc/apt/sources.list"
    printf 'Types: deb\nURIs: %s\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: %s\n\nTypes: deb\nURIs: %s\nSuites: bookworm-security\nComponents: main\nSigned-By: %s\n' \
        "$mirror" /usr/share/keyrings/debian-archive-keyring.gpg \
        "$(security_mirror)" /usr/share/keyrings/debian-archive-keyring.gpg >"$root/etc/apt/sources.list.d/debian.sources"
    # What a slim image leaves out: package caches and lists, documentation, locales.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
        "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
    tar -C "$root" -c . | podman import --change 'CMD ["python3"]' - "$base" >/dev/null
fi

secret=()
[ -f "$ca_bundle" ] && secret=(--secret "id=ca,src=$ca_bundle")
# --format docker keeps HEALTHCHECK (the OCI format has no field for it); --network host reaches the
# package index the way the machine does.
podman build --quiet --format docker --network host --build-arg "BASE=$base" "${secret[@]}" \
    --target "$target" --ignorefile deploy/Dockerfile.dockerignore -f deploy/Dockerfile -t "$tag" . >/dev/null
echo "$tag"
