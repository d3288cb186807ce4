// One role of the pipeline as a Container App: the shared image with the role as its command, the
// user-assigned identity (no secret of any kind), and a KEDA `azure-queue` scale rule on each of the
// role's queues, authenticated with that identity.

@description('Name of the Container App.')
param name string

@description('Azure region.')
param location string

@description('Resource id of the Container Apps environment.')
param environmentId string

@description('The pipeline image (ENTRYPOINT billing); the role is its command.')
param image string

@description('Registry server to pull the image from with the identity (it needs AcrPull there); empty: a public image.')
param registryServer string

@description('The role this app runs.')
@allowed([
  'initiator'
  'processor'
  'controller'
])
param role string

@description('Resource id of the user-assigned identity the role and its scale rules use.')
param identityId string

@description('The storage account whose queues the scale rules read.')
param storageAccountName string

@description('The queues whose depth scales the role: one azure-queue rule each.')
param queues array

@description('KEDA queueLength: messages per queue (being worked on included) one replica holds at once.')
param queueLength int

@description('KEDA activationQueueLength: from zero replicas, scale out once a queue holds more than this.')
param activationQueueLength int

@description('Fewest replicas.')
param minReplicas int

@description('Most replicas.')
param maxReplicas int

@description('KEDA pollingInterval, seconds.')
param pollingInterval int

@description('KEDA cooldownPeriod, seconds: how long after the last activity a role at zero-eligible goes to zero.')
param cooldownPeriod int

@description('vCPU of the container, e.g. 1.0 (Consumption profile pairs: 0.5/1Gi, 1.0/2Gi, 2.0/4Gi).')
param cpu string

@description('Memory of the container, e.g. 2Gi.')
param memory string

@description('Environment variables: BILLING_* settings, AZURE_CLIENT_ID and telemetry; values only, never secrets.')
param env array

@description('Seconds between SIGTERM and SIGKILL: above BILLING_SHUTDOWN_DEADLINE.')
param terminationGracePeriodSeconds int

@description('BILLING_HEALTH_PORT: where the role serves /healthz and /readyz.')
param healthPort int

var registry = {
  server: registryServer
  identity: identityId
}

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
      registries: empty(registryServer) ? [] : [registry]
    }
    template: {
      terminationGracePeriodSeconds: terminationGracePeriodSeconds
      containers: [
        {
          name: role
          image: image
          args: [
            role
          ]
          env: env
          resources: {
            cpu: json(cpu)
            memory: memory
          }
          // As in Kubernetes: /healthz, the role's loop turns (it answers while the role waits out a
          // storage outage); /readyz, storage (and SQL, for the controller) answer, each within 5 s.
          probes: [
            {
              type: 'Liveness'
              httpGet: {
                path: '/healthz'
                port: healthPort
              }
              periodSeconds: 10
              timeoutSeconds: 3
              failureThreshold: 3
            }
            {
              type: 'Readiness'
              httpGet: {
                path: '/readyz'
                port: healthPort
              }
              periodSeconds: 10
              timeoutSeconds: 8
              failureThreshold: 3
            }
          ]
        }
      ]
      scale: {
        minReplicas: minReplicas
        maxReplicas: maxReplicas
        pollingInterval: pollingInterval
        cooldownPeriod: cooldownPeriod
        rules: [
          for (queue, i) in queues: {
            name: '${role}-queue-${i}'
            custom: {
              type: 'azure-queue'
              metadata: {
                accountName: storageAccountName
                queueName: queue
                queueLength: string(queueLength)
                activationQueueLength: string(activationQueueLength)
              }
              identity: identityId
            }
          }
        ]
      }
    }
  }
}

@description('Name of the Container App.')
output name string = app.name
