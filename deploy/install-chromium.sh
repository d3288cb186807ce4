#!/usr/bin/env bash
# Install Debian's headless-capable chromium for the console's browser tests (tests/system/test_console.py, driven
# by Playwright through /usr/bin/chromium: Playwright's own browser download is never used); idempotent.
set -euo pipefail

if command -v chromium >/dev/null; then
    exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo)
fi
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null || { echo "chromium install failed" >&2; exit 1; }
