#!/usr/bin/env bash
# The AKS path, after `az deployment group create` of deploy/azure/main.bicep (docs/deploy.md, "AKS"):
#   1. the cluster's OIDC issuer and workload identity switched on;
#   2. the deployment's identity federated with the service accounts that act as it:
#      billing:billing (the roles and the console) and keda:keda-operator (KEDA's queue-depth reads);
#   3. the cluster's kubelet allowed to pull from the registry (AcrPull, --registry);
#   4. PostgreSQL reachable from the cluster: private (the default) peers the cluster's virtual network
#      with the deployment's both ways and links the server's private DNS zone to it; public adds a
#      firewall rule per outbound address of the cluster;
#   5. KEDA installed with Helm, podIdentity.azureWorkload on (deploy/kubernetes/keda-values.yaml)
#      as the same identity (--install-keda; otherwise the command is printed);
#   6. the values deploy/kubernetes/overlays/azure needs, printed.
# Every step is idempotent: run it again after a change.
#
# Usage: deploy/azure/aks-identity.sh --resource-group RG --cluster NAME [--cluster-resource-group RG2]
#          [--deployment main] [--registry ACR_NAME] [--install-keda]
# Needs: az (logged in, Owner or User Access Administrator on the resource groups), helm with
# --install-keda, kubectl for the cluster (az aks get-credentials) with --install-keda.
set -euo pipefail
cd "$(dirname "$0")/../.."

group="" cluster="" cluster_group="" deployment="main" registry="" install_keda=false
while [ "$#" -gt 0 ]; do
    case "$1" in
        --resource-group) group="$2"; shift 2 ;;
        --cluster) cluster="$2"; shift 2 ;;
        --cluster-resource-group) cluster_group="$2"; shift 2 ;;
        --deployment) deployment="$2"; shift 2 ;;
        --registry) registry="$2"; shift 2 ;;
        --install-keda) install_keda=true; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
[ -n "$group" ] && [ -n "$cluster" ] || { echo "--resource-group and --cluster are required" >&2; exit 2; }
cluster_group="${cluster_group:-$group}"

# The service accounts that act as the identity: <namespace>:<name>.
subjects=(billing:billing keda:keda-operator)
audience="api://AzureADTokenExchange"

output() {  # one output of the Bicep deployment
    az deployment group show --resource-group "$group" --name "$deployment" \
        --query "properties.outputs.$1.value" --output tsv
}

identity="$(output identityName)"
client_id="$(az identity show --resource-group "$group" --name "$identity" --query clientId --output tsv)"
tenant_id="$(az identity show --resource-group "$group" --name "$identity" --query tenantId --output tsv)"

# 1. OIDC issuer and workload identity (the mutating webhook that hands pods their token).
enabled="$(az aks show --resource-group "$cluster_group" --name "$cluster" \
    --query "[oidcIssuerProfile.enabled, securityProfile.workloadIdentity.enabled]" --output tsv | tr -s '\t\n' '  ')"
if [ "$enabled" != "true true " ] && [ "$enabled" != "true true" ]; then
    echo "enabling the OIDC issuer and workload identity on $cluster" >&2
    az aks update --resource-group "$cluster_group" --name "$cluster" \
        --enable-oidc-issuer --enable-workload-identity --output none
fi
issuer="$(az aks show --resource-group "$cluster_group" --name "$cluster" \
    --query oidcIssuerProfile.issuerUrl --output tsv)"

# 2. One federated credential per service account (create is a PUT: it updates one that exists).
for subject in "${subjects[@]}"; do
    namespace="${subject%%:*}" account="${subject#*:}"
    echo "federating $identity with system:serviceaccount:$namespace:$account" >&2
    az identity federated-credential create --resource-group "$group" --identity-name "$identity" \
        --name "$cluster-$namespace-$account" --issuer "$issuer" \
        --subject "system:serviceaccount:$namespace:$account" --audiences "$audience" --output none
done

# 3. Image pulls by the cluster's kubelet identity.
if [ -n "$registry" ]; then
    echo "granting $cluster AcrPull on $registry" >&2
    az aks update --resource-group "$cluster_group" --name "$cluster" --attach-acr "$registry" --output none
fi

# 4. PostgreSQL from the cluster.
postgres_host="$(output postgresHost)"
server="${postgres_host%%.*}"
access="$(az postgres flexible-server show --resource-group "$group" --name "$server" \
    --query network.publicNetworkAccess --output tsv)"
if [ "$access" = "Disabled" ]; then
    vnet_name="$(output vnetName)"
    vnet_id="$(az network vnet show --resource-group "$group" --name "$vnet_name" --query id --output tsv)"
    # The cluster's network: its node subnet's (bring-your-own), or the one AKS made in the node group.
    subnet_id="$(az aks show --resource-group "$cluster_group" --name "$cluster" \
        --query "agentPoolProfiles[0].vnetSubnetId" --output tsv)"
    if [ -n "$subnet_id" ] && [ "$subnet_id" != "None" ]; then
        cluster_vnet_id="${subnet_id%/subnets/*}"
    else
        node_group="$(az aks show --resource-group "$cluster_group" --name "$cluster" \
            --query nodeResourceGroup --output tsv)"
        cluster_vnet_id="$(az network vnet list --resource-group "$node_group" --query "[0].id" --output tsv)"
    fi
    cluster_vnet_group="$(cut -d/ -f5 <<<"$cluster_vnet_id")"
    cluster_vnet_name="${cluster_vnet_id##*/}"
    echo "peering $cluster_vnet_name with $vnet_name and linking the PostgreSQL DNS zone" >&2
    az network vnet peering create --resource-group "$cluster_vnet_group" --vnet-name "$cluster_vnet_name" \
        --name "to-$vnet_name" --remote-vnet "$vnet_id" --allow-vnet-access --output none
    az network vnet peering create --resource-group "$group" --vnet-name "$vnet_name" \
        --name "to-$cluster_vnet_name" --remote-vnet "$cluster_vnet_id" --allow-vnet-access --output none
    zone="$(az network private-dns zone list --resource-group "$group" \
        --query "[?ends_with(name, 'postgres.database.azure.com')].name | [0]" --output tsv)"
    az network private-dns link vnet create --resource-group "$group" --zone-name "$zone" \
        --name "$cluster_vnet_name" --virtual-network "$cluster_vnet_id" --registration-enabled false --output none
else
    number=0
    for address_id in $(az aks show --resource-group "$cluster_group" --name "$cluster" \
        --query "networkProfile.loadBalancerProfile.effectiveOutboundIPs[].id" --output tsv); do
        address="$(az network public-ip show --ids "$address_id" --query ipAddress --output tsv)"
        echo "admitting $cluster's outbound address $address to $server" >&2
        az postgres flexible-server firewall-rule create --resource-group "$group" --name "$server" \
            --rule-name "$cluster-egress-$number" --start-ip-address "$address" --end-ip-address "$address" \
            --output none
        number=$((number + 1))
    done
fi

# 5. KEDA with workload identity: its operator's service account (keda:keda-operator) acts as the identity.
keda=(helm upgrade --install keda kedacore/keda --namespace keda --create-namespace
    --values deploy/kubernetes/keda-values.yaml
    --set "podIdentity.azureWorkload.clientId=$client_id" --set "podIdentity.azureWorkload.tenantId=$tenant_id")
if "$install_keda"; then
    helm repo add kedacore https://kedacore.github.io/charts >/dev/null 2>&1 || true
    helm repo update kedacore >/dev/null
    "${keda[@]}"
else
    echo "install KEDA with:" >&2
    echo "  helm repo add kedacore https://kedacore.github.io/charts && ${keda[*]}" >&2
fi

# 6. What deploy/kubernetes/overlays/azure needs.
account_url="$(output storageAccountUrl)"
account="${account_url#https://}"
account="${account%%.*}"
cat <<VALUES
# deploy/kubernetes/overlays/azure/names.yaml
storageAccount: $account
clientId: $client_id
# deploy/kubernetes/overlays/azure/billing.env
BILLING_STORAGE_ACCOUNT_URL=$account_url
BILLING_SQL_URL=postgresql://$identity@$postgres_host:5432/billing?sslmode=require
VALUES
