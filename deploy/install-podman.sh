#!/usr/bin/env bash
# Installs what building and running the billing image needs on Debian 12 (CI, a developer's machine):
# podman with runc, and debootstrap to make the base image without a registry. Idempotent and quick
# when everything is there. Use deploy/containers.conf with it (deploy/build-image.sh does).
set -euo pipefail

# dnsname: containers of a compose network reach each other by service name (CNI, podman 4.3).
packages=(podman runc debootstrap golang-github-containernetworking-plugin-dnsname)
missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
    sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
podman --version
