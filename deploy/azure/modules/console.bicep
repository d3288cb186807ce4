// The console and read-only JSON API (`billing serve`) as a Container App with HTTP ingress: one
// replica, no scale rule, the roles' identity and settings. Ingress is internal by default (only apps
// of the environment reach it); with external ingress it answers the virtual network the internal
// environment lives in, never the Internet. Poison replay and purge need BILLING_CONSOLE_TOKEN: a
// Container Apps secret that references a Key Vault secret by URL, read as the identity (no value
// here); without one the console is read-only.

@description('Name of the Container App.')
param name string

@description('Azure region.')
param location string

@description('Resource id of the Container Apps environment.')
param environmentId string

@description('The pipeline image (ENTRYPOINT billing).')
param image string

@description('Registry server to pull the image from with the identity; empty: a public image.')
param registryServer string

@description('Resource id of the user-assigned identity the console uses (storage, SQL, Key Vault).')
param identityId string

@description('Environment variables: BILLING_* settings and AZURE_CLIENT_ID; values only, never secrets.')
param env array

@description('URL of the Key Vault secret holding the console token (https://<vault>.vault.azure.net/secrets/<name>); empty: read-only.')
param tokenSecretUrl string

@description('Ingress from the virtual network (true) or only from the environment\'s apps (false).')
param externalIngress bool

@description('Port `billing serve` listens on.')
param port int

var tokenSecret = 'console-token'

resource app 'Microsoft.App/containerApps@2025-01-01' = {
  name: name
  location: location
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    environmentId: environmentId
    workloadProfileName: 'Consumption'
    configuration: {
      activeRevisionsMode: 'Single'
      registries: empty(registryServer) ? [] : [
        {
          server: registryServer
          identity: identityId
        }
      ]
      ingress: {
        external: externalIngress
        targetPort: port
        transport: 'http'
        allowInsecure: false
      }
      // A reference to Key Vault, resolved by the platform as the identity: the value is never here.
      secrets: empty(tokenSecretUrl) ? [] : [
        {
          name: tokenSecret
          keyVaultUrl: tokenSecretUrl
          identity: identityId
        }
      ]
    }
    template: {
      containers: [
        {
          name: 'console'
          image: image
          args: [
            'serve'
            '--host'
            '0.0.0.0'
            '--port'
            string(port)
          ]
          env: concat(env, empty(tokenSecretUrl) ? [] : [
            {
              name: 'BILLING_CONSOLE_TOKEN'
              secretRef: tokenSecret
            }
          ])
          resources: {
            cpu: json('0.5')
            memory: '1Gi'
          }
          // `billing serve` has no /healthz: alive when it answers its OpenAPI document (no I/O), ready
          // when it reads a page of batches from SQL.
          probes: [
            {
              type: 'Liveness'
              httpGet: {
                path: '/openapi.json'
                port: port
              }
              periodSeconds: 10
              timeoutSeconds: 3
              failureThreshold: 3
            }
            {
              type: 'Readiness'
              httpGet: {
                path: '/api/batches?limit=1'
                port: port
              }
              periodSeconds: 30
              timeoutSeconds: 8
              failureThreshold: 3
            }
          ]
        }
      ]
      scale: {
        minReplicas: 1
        maxReplicas: 1
        rules: []
      }
    }
  }
}

@description('Name of the Container App.')
output name string = app.name

@description('Host name of the console (reachable from the environment, or the virtual network with external ingress).')
output fqdn string = app.properties.configuration.ingress.fqdn
