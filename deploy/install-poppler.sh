#!/usr/bin/env bash
# Install Debian's poppler-utils for the document tests (pdftotext and pdftoppm read the PDFs `billing documents
# show --format pdf` and the API write: tests/system/test_ledger_views.py); idempotent.
set -euo pipefail

if command -v pdftotext >/dev/null && command -v pdftoppm >/dev/null; then
    exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo)
fi
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends poppler-utils >/dev/null
if ! command -v pdftotext >/dev/null || ! command -v pdftoppm >/dev/null; then
    echo "poppler-utils install failed" >&2
    exit 1
fi
