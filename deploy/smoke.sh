#!/usr/bin/env bash
# A smoke test of a real deployment, for you to run after `kubectl apply -k deploy/kubernetes/overlays/...`
# or `az deployment group create ... deploy/azure/main.bicep`: from inside the console (which has the
# roles' settings and identity) it generates a small batch, submits it, waits for it to complete and
# checks its status. The batch completes only if KEDA scales each role from zero on its queue, the
# identity reaches storage and PostgreSQL, and the controller folds the results: exit 0 means the
# deployment works end to end.
# Usage: deploy/smoke.sh kubernetes [NAMESPACE]            (default billing; kubectl's current context)
#        deploy/smoke.sh azure RESOURCE_GROUP [NAME_PREFIX] (default billing; needs `az login`)
# BILLING_SMOKE_ROWS sets the batch's size (default 20000).
set -euo pipefail

target="${1:-}"
rows="${BILLING_SMOKE_ROWS:-20000}"
batch="smoke-$(date +%Y%m%d%H%M%S)"

case "$target" in
    kubernetes)
        namespace="${2:-billing}"
        kubectl rollout status deployment/billing-console --namespace "$namespace" --timeout 300s >&2
        in_console() { kubectl exec --namespace "$namespace" deployment/billing-console -- "$@"; }
        ;;
    azure)
        group="${2:?resource group}"
        app="${3:-billing}-console"
        # One command per call: `az containerapp exec` runs a program, not a shell line.
        in_console() { az containerapp exec --resource-group "$group" --name "$app" --command "$*"; }
        ;;
    *)
        sed -n '2,11p' "$0" >&2
        exit 2
        ;;
esac

echo "the console answers" >&2
in_console python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/openapi.json', timeout=10)"
echo "submitting $batch ($rows rows) and waiting for it (roles start from zero: allow minutes)" >&2
in_console billing generate --rows "$rows" --seed 7 --out "/tmp/$batch.csv"
in_console billing reference --out-dir "/tmp/$batch-reference"
in_console billing submit "/tmp/$batch.csv" --batch-id "$batch" \
    --pricebook "/tmp/$batch-reference/pricebook.csv" --taxes "/tmp/$batch-reference/taxes.csv" \
    --wait --timeout 900
status="$(in_console billing status "$batch" --json)"
echo "$status"
if grep -q '"state": "complete"' <<<"$status"; then
    echo "smoke test passed: $batch complete" >&2
else
    echo "smoke test FAILED: $batch is not complete (see above; billing poison list, the roles' logs)" >&2
    exit 1
fi
