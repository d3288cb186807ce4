// The billing pipeline's whole environment on Azure, keyless: a storage account with the pipeline's
// queues and containers (shared keys off), a Service Bus Standard namespace with the trigger topic,
// PostgreSQL Flexible Server with Entra authentication only, Log Analytics and Application Insights,
// an Azure Container Registry, alert rules, a Key Vault for the console's token, and a Container Apps
// environment running the three roles from one image, each scaled by KEDA `azure-queue` rules on its
// own queues, and the console (`billing serve`, one replica, internal HTTP ingress). Every role authenticates
// as one user-assigned identity that holds exactly these roles, each on the one resource it concerns:
// Storage Queue Data Contributor and Storage Blob Data Contributor on the storage account, Azure
// Service Bus Data Sender and Receiver on the trigger topic, Monitoring Metrics Publisher on Application
// Insights (whose local authentication is off: telemetry goes in with Entra tokens), AcrPull on the
// registry the template creates, and Key Vault Secrets User on the vault (the console's token).
//
// API versions are GA wherever a GA version has what is used; a preview one says why beside it
// (tests/deploy/test_bicep.py checks both).
//
// Deploy: see README.md. The scale numbers equal the KEDA ScaledObjects of deploy/kubernetes
// (tests/deploy/test_bicep.py compares them); names follow shared/settings.py.

targetScope = 'resourceGroup'

// ---- names and region -----------------------------------------------------------------------

@description('Short prefix of every resource name (lowercase letters, digits and hyphens).')
@minLength(3)
@maxLength(12)
param namePrefix string = 'billing'

@description('Azure region of every resource.')
param location string = resourceGroup().location

@description('Storage account name (3-24 lowercase letters and digits, globally unique).')
@minLength(3)
@maxLength(24)
param storageAccountName string = take('${replace(namePrefix, '-', '')}${uniqueString(resourceGroup().id)}', 24)

@description('Service Bus namespace name (globally unique).')
param serviceBusName string = '${namePrefix}-sb-${uniqueString(resourceGroup().id)}'

@description('PostgreSQL Flexible Server name (globally unique).')
param postgresServerName string = '${namePrefix}-pg-${uniqueString(resourceGroup().id)}'

@description('Name of the user-assigned identity; also its PostgreSQL role name.')
param identityName string = '${namePrefix}-id'

@description('Log Analytics workspace name.')
param logAnalyticsName string = '${namePrefix}-logs'

@description('Application Insights name.')
param appInsightsName string = '${namePrefix}-insights'

@description('Container Apps environment name.')
param environmentName string = '${namePrefix}-env'

@description('Virtual network name (the environment and PostgreSQL live in it).')
param vnetName string = '${namePrefix}-vnet'

// ---- the application ------------------------------------------------------------------------

@description('The pipeline image (ENTRYPOINT billing, the role as command), e.g. billingacr1234.azurecr.io/billing:1.0.')
param image string

@description('The console\'s image (the Dockerfile\'s console target); empty: image with its repository\'s name followed by -console (…/billing:1.0 gives …/billing-console:1.0).')
param consoleImage string = ''

@description('Create an Azure Container Registry (Basic, admin user off, anonymous pull off) and grant the identity AcrPull on it; false: pull from registryServer instead.')
param createRegistry bool = true

@description('Name of the registry the template creates (5-50 lowercase letters and digits, globally unique).')
@minLength(5)
@maxLength(50)
param registryName string = take('${replace(namePrefix, '-', '')}acr${uniqueString(resourceGroup().id)}', 50)

@description('With createRegistry false: an existing registry to pull from as the identity (grant it AcrPull there, see README); empty for a public image.')
param registryServer string = ''

@description('Deploy the Container Apps. false on a first deployment that creates the registry: push the image, then deploy again with true (README).')
param deployApps bool = true

// ---- the console -------------------------------------------------------------------------------

@description('Deploy the console (`billing serve`) as a Container App of one replica with HTTP ingress.')
param deployConsole bool = true

@description('Console ingress from the virtual network (true) or only from the environment\'s apps (false). The environment is internal: never from the Internet.')
param consoleExternalIngress bool = false

@description('Name of the Key Vault secret holding BILLING_CONSOLE_TOKEN, set by you in the template\'s vault (README); empty: the console is read-only.')
param consoleTokenSecretName string = ''

@description('Key Vault name (3-24 letters, digits and hyphens, globally unique).')
@minLength(3)
@maxLength(24)
param keyVaultName string = take('${namePrefix}-kv-${uniqueString(resourceGroup().id)}', 24)

// ---- alerts ---------------------------------------------------------------------------------

@description('E-mail address the alert rules notify; empty: the alerts show in Azure Monitor only.')
param alertEmail string = ''

@description('Minutes a pipeline queue may hold work without progress before the backlog alert fires.')
@minValue(5)
param backlogAgeMinutes int = 15

@description('BILLING_QUEUE_PREFIX: the queues are <prefix>-requests, <prefix>-input-0..N-1, <prefix>-results, each with a -poison queue.')
@minLength(1)
@maxLength(40)
param queuePrefix string = 'billing'

@description('BILLING_PARTITIONS: number of input queues.')
@minValue(1)
@maxValue(64)
param partitions int = 4

@description('BILLING_TRIGGER_TOPIC: the Service Bus topic of "work detected" triggers.')
param triggerTopic string = 'billing-triggers'

@description('Name of the PostgreSQL database the controller keeps batches in.')
param databaseName string = 'billing'

@description('How PostgreSQL is reached: private (a delegated subnet of this virtual network; an AKS cluster peers its network with it, see docs/deploy.md) or public (the firewall rules below). Entra authentication only, either way.')
@allowed([
  'private'
  'public'
])
param postgresNetwork string = 'private'

@description('With postgresNetwork public: firewall rules, [{name, startIpAddress, endIpAddress}], e.g. an AKS cluster\'s outbound addresses (deploy/azure/aks-identity.sh adds those itself).')
param postgresFirewallRules array = []

@description('With postgresNetwork public: admit connections from Azure services (the 0.0.0.0 rule). The Container Apps need it, their outbound address not being fixed; they still log in with the identity\'s token only.')
param postgresAllowAzureServices bool = true

@description('Object id of an Entra user or group that may also administer PostgreSQL (people); empty: none.')
param postgresAdminObjectId string = ''

@description('Display name of that Entra user or group.')
param postgresAdminName string = ''

@description('Kind of that Entra principal.')
@allowed([
  'User'
  'Group'
])
param postgresAdminType string = 'Group'

@description('BILLING_SHUTDOWN_DEADLINE, seconds: how long in-flight work may take after SIGTERM.')
@minValue(1)
@maxValue(500)
param shutdownDeadline int = 30

// ---- replica bounds (the rest of the scale rules is in `roles` below) ---------------------------

@description('Processor replicas at rest (0: none while the input queues are empty).')
@minValue(0)
param processorMinReplicas int = 0

@description('Most processor replicas: two per partition rate far more than one initiator debatches.')
@minValue(1)
param processorMaxReplicas int = 8

@description('Initiator replicas at rest.')
@minValue(0)
param initiatorMinReplicas int = 0

@description('Most initiator replicas (a batch is debatched by one initiator).')
@minValue(1)
param initiatorMaxReplicas int = 1

@description('Controller replicas at rest (1 when a secondary account is used: the syphon runs in it).')
@minValue(0)
param controllerMinReplicas int = 0

@description('Most controller replicas (one writer folds a batch\'s partials).')
@minValue(1)
param controllerMaxReplicas int = 1

// ---- names the application derives (shared/settings.py) --------------------------------------

var requestsQueue = '${queuePrefix}-requests'
var inputQueues = [for i in range(0, partitions): '${queuePrefix}-input-${i}']
var resultsQueue = '${queuePrefix}-results'
var pipelineQueues = concat([requestsQueue], inputQueues, [resultsQueue])
var poisonQueues = [for queue in pipelineQueues: '${queue}-poison']
var healthPort = 8080 // BILLING_HEALTH_PORT: /healthz, /readyz and /metrics, as in Kubernetes
var inboxContainer = 'billing-inbox'
var workContainer = 'billing-work'
var referenceContainer = 'billing-reference'
var blobContainers = [
  inboxContainer
  workContainer
  referenceContainer
]

// Built-in role definitions, by id: the identity holds these and no other.
var storageQueueDataContributor = '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
var storageBlobDataContributor = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'
var serviceBusDataSender = '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
var serviceBusDataReceiver = '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
var monitoringMetricsPublisher = '3913510d-42f4-4e42-8a64-420c390055eb'
var acrPullRole = '7f951dda-4ed3-4680-a7ca-43fe172d538d'
var keyVaultSecretsUser = '4633458b-17de-408a-b874-0445c86b69e6'
var consolePort = 8080 // `billing serve --port`

// The registry the apps pull from: the one created here (its login server is its name), or registryServer.
var pullServer = createRegistry ? '${registryName}.azurecr.io' : registryServer

// ---- identity ---------------------------------------------------------------------------------

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: identityName
  location: location
}

// ---- network: the environment's subnet and PostgreSQL's, with its private DNS zone --------------

resource vnet 'Microsoft.Network/virtualNetworks@2024-05-01' = {
  name: vnetName
  location: location
  properties: {
    addressSpace: {
      addressPrefixes: [
        '10.40.0.0/16'
      ]
    }
    subnets: [
      {
        name: 'snet-apps'
        properties: {
          addressPrefix: '10.40.0.0/23'
          delegations: [
            {
              name: 'managed-environments'
              properties: {
                serviceName: 'Microsoft.App/environments'
              }
            }
          ]
        }
      }
      {
        name: 'snet-postgres'
        properties: {
          addressPrefix: '10.40.2.0/24'
          delegations: [
            {
              name: 'flexible-servers'
              properties: {
                serviceName: 'Microsoft.DBforPostgreSQL/flexibleServers'
              }
            }
          ]
        }
      }
    ]
  }
}

var postgresPrivate = postgresNetwork == 'private'
var azureServicesRule = [
  {
    name: 'AllowAllAzureServicesAndResourcesWithinAzureIps'
    startIpAddress: '0.0.0.0'
    endIpAddress: '0.0.0.0'
  }
]
var postgresRules = postgresPrivate ? [] : concat(postgresAllowAzureServices ? azureServicesRule : [], postgresFirewallRules)

resource postgresDns 'Microsoft.Network/privateDnsZones@2024-06-01' = if (postgresPrivate) {
  name: '${postgresServerName}.private.postgres.database.azure.com'
  location: 'global'
}

resource postgresDnsLink 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2024-06-01' = if (postgresPrivate) {
  parent: postgresDns
  name: vnetName
  location: 'global'
  properties: {
    registrationEnabled: false
    virtualNetwork: {
      id: vnet.id
    }
  }
}

// ---- storage: the pipeline's queues and containers, reachable with Entra tokens only -------------

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_43: the name is a parameter (default from namePrefix and uniqueString), bounded by @minLength/@maxLength; Azure refuses a malformed one
  // checkov:skip=CKV_AZURE_35: the KEDA scaler of Container Apps and `billing submit` from users' machines reach the account over its public endpoint; every request needs an Entra token (shared keys are off)
  // checkov:skip=CKV_AZURE_59: as CKV_AZURE_35: public endpoint, Entra authentication only
  // checkov:skip=CKV_AZURE_206: locally redundant on purpose: queues hold work in flight and the pipeline fails over to a secondary account (BILLING_SECONDARY_*) rather than relying on geo-replication
  name: storageAccountName
  location: location
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    accessTier: 'Hot'
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    allowBlobPublicAccess: false
    allowCrossTenantReplication: false
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      defaultAction: 'Allow'
      bypass: 'AzureServices'
    }
  }
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource queues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [
  for queue in concat(pipelineQueues, poisonQueues): {
    parent: queueService
    name: queue
  }
]

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

resource containers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = [
  for container in blobContainers: {
    parent: blobService
    name: container
    properties: {
      publicAccess: 'None'
    }
  }
]

// preview: no GA version of diagnosticSettings exists as an extension of any resource with categoryGroup
// (2016-09-01, the only GA one, has neither).
resource queueDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  scope: queueService
  name: 'to-log-analytics'
  properties: {
    workspaceId: logs.id
    logs: [
      {
        category: 'StorageRead'
        enabled: true
      }
      {
        category: 'StorageWrite'
        enabled: true
      }
      {
        category: 'StorageDelete'
        enabled: true
      }
    ]
  }
}

// ---- Service Bus: the trigger topic and one declared subscription per role ----------------------

resource serviceBus 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: serviceBusName
  location: location
  sku: {
    name: 'Standard'
    tier: 'Standard'
  }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
  }
}

resource topic 'Microsoft.ServiceBus/namespaces/topics@2024-01-01' = {
  parent: serviceBus
  name: triggerTopic
  properties: {
    defaultMessageTimeToLive: 'PT5M' // a trigger older than this is worth nothing
  }
}

// Declared ahead (BILLING_TRIGGER_CREATE_SUBSCRIPTION=false): creating subscriptions at run time
// would need Azure Service Bus Data Owner. A role's replicas share its subscription, so a trigger
// wakes one replica of each role; the others find work at start, by KEDA and the safety poll.
resource subscriptions 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2024-01-01' = [
  for role in [
    'initiator'
    'processor'
    'controller'
  ]: {
    parent: topic
    name: role
    properties: {
      defaultMessageTimeToLive: 'PT5M'
      deadLetteringOnMessageExpiration: false
      maxDeliveryCount: 10
      lockDuration: 'PT30S'
    }
  }
]

// ---- PostgreSQL: Entra authentication only, on a private subnet or behind firewall rules ----------

resource postgres 'Microsoft.DBforPostgreSQL/flexibleServers@2024-08-01' = {
  name: postgresServerName
  location: location
  sku: {
    name: 'Standard_B1ms'
    tier: 'Burstable'
  }
  properties: {
    version: '16'
    storage: {
      storageSizeGB: 32
      autoGrow: 'Enabled'
    }
    backup: {
      backupRetentionDays: 7
      geoRedundantBackup: 'Disabled'
    }
    highAvailability: {
      mode: 'Disabled'
    }
    network: postgresPrivate ? {
      delegatedSubnetResourceId: '${vnet.id}/subnets/snet-postgres'
      privateDnsZoneArmResourceId: postgresDns.id
      publicNetworkAccess: 'Disabled'
    } : {
      publicNetworkAccess: 'Enabled'
    }
    authConfig: {
      activeDirectoryAuth: 'Enabled'
      passwordAuth: 'Disabled'
      tenantId: subscription().tenantId
    }
  }
  dependsOn: [
    postgresDnsLink
  ]
}

// The identity administers its own server: the controller connects as it with an Entra token and
// migrates the schema; no password exists. People may be added as a second administrator.
module postgresIdentityAdmin 'modules/postgres-admin.bicep' = {
  name: 'postgres-admin-identity'
  params: {
    serverName: postgres.name
    objectId: identity.properties.principalId
    principalName: identity.name
    principalType: 'ServicePrincipal'
  }
  dependsOn: [
    database // the server takes one change at a time
  ]
}

module postgresPeopleAdmin 'modules/postgres-admin.bicep' = if (!empty(postgresAdminObjectId)) {
  name: 'postgres-admin-people'
  params: {
    serverName: postgres.name
    objectId: postgresAdminObjectId
    principalName: postgresAdminName
    principalType: postgresAdminType
  }
  dependsOn: [
    postgresIdentityAdmin // the server takes one change at a time
  ]
}

// Public access only: who may connect at all (each still needs an Entra token of an administrator or role).
@batchSize(1) // the server takes one change at a time
resource postgresFirewall 'Microsoft.DBforPostgreSQL/flexibleServers/firewallRules@2024-08-01' = [
  for rule in postgresRules: {
    parent: postgres
    name: rule.name
    properties: {
      startIpAddress: rule.startIpAddress
      endIpAddress: rule.endIpAddress
    }
    dependsOn: [
      postgresIdentityAdmin
      postgresPeopleAdmin
    ]
  }
]

resource database 'Microsoft.DBforPostgreSQL/flexibleServers/databases@2024-08-01' = {
  parent: postgres
  name: databaseName
  properties: {
    charset: 'UTF8'
    collation: 'en_US.utf8'
  }
}

// ---- monitoring --------------------------------------------------------------------------------

resource logs 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: logAnalyticsName
  location: location
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: 30
  }
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: appInsightsName
  location: location
  kind: 'other'
  properties: {
    Application_Type: 'other'
    WorkspaceResourceId: logs.id
    // Entra authentication only: the instrumentation key in the connection string no longer lets
    // anyone send telemetry. The roles' exporter authenticates as the identity, which holds
    // Monitoring Metrics Publisher here (APPLICATIONINSIGHTS_AUTHENTICATION_STRING, shared/telemetry.py).
    DisableLocalAuth: true
  }
}

module alerts 'modules/alerts.bicep' = {
  name: 'alerts'
  params: {
    location: location
    workspaceId: logs.id
    storageAccountName: storage.name
    queuePrefix: queuePrefix
    namePrefix: namePrefix
    backlogAgeMinutes: backlogAgeMinutes
    alertEmail: alertEmail
  }
}

// ---- Key Vault: the console's token, set by the operator, read by the platform as the identity ----

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  // checkov:skip=CKV_AZURE_109: the operator sets the console token from a workstation and Container Apps resolves it over the public endpoint; every request needs an Entra token with a data role (RBAC, no access policies)
  // checkov:skip=CKV_AZURE_189: as CKV_AZURE_109: public endpoint, Entra authorization only
  name: keyVaultName
  location: location
  properties: {
    tenantId: subscription().tenantId
    sku: {
      family: 'A'
      name: 'standard'
    }
    enableRbacAuthorization: true
    enableSoftDelete: true
    softDeleteRetentionInDays: 7
    enablePurgeProtection: true
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      defaultAction: 'Allow'
      bypass: 'AzureServices'
    }
  }
}

// ---- container registry ----------------------------------------------------------------------

resource registry 'Microsoft.ContainerRegistry/registries@2023-07-01' = if (createRegistry) {
  // checkov:skip=CKV_AZURE_163: vulnerability scanning is Microsoft Defender for Containers, a subscription-wide plan enabled outside this template
  // checkov:skip=CKV_AZURE_166: quarantine needs the Premium tier; pushes come from the operator's own build
  // checkov:skip=CKV_AZURE_233: zone redundancy needs the Premium tier; a lost zone delays pulls, never work in the queues
  // checkov:skip=CKV_AZURE_139: the Container Apps environment and the operator's build push and pull over the public endpoint, with Entra tokens only (admin user off)
  name: registryName
  location: location
  sku: {
    name: 'Basic'
  }
  properties: {
    adminUserEnabled: false
    anonymousPullEnabled: false
    publicNetworkAccess: 'Enabled'
  }
}

// ---- Container Apps ----------------------------------------------------------------------------

resource appsEnvironment 'Microsoft.App/managedEnvironments@2025-01-01' = {
  name: environmentName
  location: location
  properties: {
    // Logs reach Log Analytics through the diagnostic settings below: no workspace key is handed over.
    appLogsConfiguration: {
      destination: 'azure-monitor'
    }
    vnetConfiguration: {
      infrastructureSubnetId: '${vnet.id}/subnets/snet-apps'
      internal: true // the roles only call out; the console answers the virtual network at most
    }
    workloadProfiles: [
      {
        name: 'Consumption'
        workloadProfileType: 'Consumption'
      }
    ]
  }
}

// preview: as queueDiagnostics above, no GA version has categoryGroup.
resource environmentDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  scope: appsEnvironment
  name: 'to-log-analytics'
  properties: {
    workspaceId: logs.id
    logs: [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ]
  }
}

// Settings every role shares: the account by URL (DefaultAzureCredential picks the identity named by
// AZURE_CLIENT_ID), the names above, and Service Bus triggers on declared subscriptions.
var commonEnv = [
  {
    name: 'AZURE_CLIENT_ID'
    value: identity.properties.clientId
  }
  {
    // The credential chain is the platform's managed identity only: no probe of other credentials.
    name: 'AZURE_TOKEN_CREDENTIALS'
    value: 'ManagedIdentityCredential'
  }
  {
    name: 'BILLING_STORAGE_ACCOUNT_URL'
    value: storage.properties.primaryEndpoints.queue
  }
  {
    name: 'BILLING_QUEUE_PREFIX'
    value: queuePrefix
  }
  {
    name: 'BILLING_PARTITIONS'
    value: string(partitions)
  }
  {
    name: 'BILLING_INBOX_CONTAINER'
    value: inboxContainer
  }
  {
    name: 'BILLING_WORK_CONTAINER'
    value: workContainer
  }
  {
    name: 'BILLING_REFERENCE_CONTAINER'
    value: referenceContainer
  }
  {
    name: 'BILLING_TRIGGER_BACKEND'
    value: 'servicebus'
  }
  {
    name: 'BILLING_SERVICEBUS_NAMESPACE'
    value: '${serviceBus.name}.servicebus.windows.net'
  }
  {
    name: 'BILLING_TRIGGER_TOPIC'
    value: topic.name
  }
  {
    name: 'BILLING_TRIGGER_CREATE_SUBSCRIPTION'
    value: 'false'
  }
  {
    name: 'BILLING_HEALTH_PORT'
    value: string(healthPort)
  }
  {
    name: 'BILLING_SHUTDOWN_DEADLINE'
    value: string(shutdownDeadline)
  }
  {
    // Names the resource (its instrumentation key is no credential: local authentication is off).
    name: 'APPLICATIONINSIGHTS_CONNECTION_STRING'
    value: appInsights.properties.ConnectionString
  }
  {
    // Entra authentication of the exporter, as the identity (shared/telemetry.py hands it the same
    // credential chain as the roles': AZURE_TOKEN_CREDENTIALS above).
    name: 'APPLICATIONINSIGHTS_AUTHENTICATION_STRING'
    value: 'Authorization=AAD;ClientId=${identity.properties.clientId}'
  }
]

// The three roles: what differs between them. The scale numbers are those of the KEDA ScaledObjects
// in deploy/kubernetes/base, where each is explained from measured service times or, for the
// processor's queueLength, from what one replica holds at once (tested equal).
// CPU and memory from the measured peak RSS (README, "Measured": initiator and controller under
// 600 MiB at 10 M rows, a processor and its rating worker under 400 MiB), in Consumption sizes.
var roles = [
  {
    name: 'initiator'
    queues: [
      requestsQueue
    ]
    queueLength: 1
    activationQueueLength: 0
    pollingInterval: 5
    cooldownPeriod: 60
    minReplicas: initiatorMinReplicas
    maxReplicas: initiatorMaxReplicas
    cpu: '1.0'
    memory: '2Gi'
  }
  {
    name: 'processor'
    queues: inputQueues
    // What one replica holds at once: BILLING_CPU_WORKERS 1 (its one vCPU) x (1 + 1 prefetched) = 2 work items
    // over the input queues (4 by default), half a queue's item, rounded up to the smallest whole target, 1.
    // Each rule asks ceil(depth / queueLength), the app the largest: a 1,000,000-row batch (about 22 items,
    // round-robin 6, 6, 5, 5) asks for 6 replicas. With n vCPU and workers: ceil(n x 2 / partitions).
    queueLength: 1
    activationQueueLength: 0
    pollingInterval: 10
    cooldownPeriod: 120
    minReplicas: processorMinReplicas
    maxReplicas: processorMaxReplicas
    cpu: '1.0'
    memory: '2Gi'
  }
  {
    name: 'controller'
    queues: [
      resultsQueue
    ]
    queueLength: 1
    activationQueueLength: 0
    pollingInterval: 10
    cooldownPeriod: 300
    minReplicas: controllerMinReplicas
    maxReplicas: controllerMaxReplicas
    cpu: '0.5'
    memory: '1Gi'
  }
]

// Settings of one role only, kept out of `roles`: a loop runs over `roles`, so it must be known at
// the start of the deployment, and the server's host name is known only once the server exists.
var roleEnv = {
  initiator: []
  processor: [
    {
      name: 'BILLING_CPU_WORKERS' // the container's cores, not the host's that os.cpu_count() sees
      value: '1'
    }
  ]
  controller: [
    {
      // Entra authentication as the identity, which administers the server: no password (see README).
      name: 'BILLING_SQL_URL'
      value: 'postgresql://${identity.name}@${postgres.properties.fullyQualifiedDomainName}:5432/${databaseName}?sslmode=require'
    }
  ]
}

module apps 'modules/app.bicep' = [
  for role in roles: if (deployApps) {
    name: 'app-${role.name}'
    params: {
      name: '${namePrefix}-${role.name}'
      location: location
      environmentId: appsEnvironment.id
      image: image
      registryServer: pullServer
      role: role.name
      identityId: identity.id
      storageAccountName: storage.name
      queues: role.queues
      queueLength: role.queueLength
      activationQueueLength: role.activationQueueLength
      minReplicas: role.minReplicas
      maxReplicas: role.maxReplicas
      pollingInterval: role.pollingInterval
      cooldownPeriod: role.cooldownPeriod
      cpu: role.cpu
      memory: role.memory
      env: concat(commonEnv, roleEnv[role.name], [
        {
          name: 'BILLING_TRIGGER_SUBSCRIPTION'
          value: role.name
        }
        {
          name: 'OTEL_SERVICE_NAME'
          value: 'billing-${role.name}'
        }
      ])
      terminationGracePeriodSeconds: shutdownDeadline + 15
      healthPort: healthPort
    }
    dependsOn: [
      queues
      containers
      subscriptions
      queueDataContributor
      blobDataContributor
      topicSender
      topicReceiver
      metricsPublisher
      acrPull
      // The controller logs in to PostgreSQL as the identity: it must be the server's administrator
      // (and the database exist, and a public server admit the apps) before any app starts.
      postgresIdentityAdmin
      database
      postgresFirewall
    ]
  }
]

module console 'modules/console.bicep' = if (deployApps && deployConsole) {
  name: 'app-console'
  params: {
    name: '${namePrefix}-console'
    location: location
    environmentId: appsEnvironment.id
    image: empty(consoleImage) ? replace(image, '/billing:', '/billing-console:') : consoleImage
    registryServer: pullServer
    identityId: identity.id
    // The roles' settings and the controller's SQL login: the console reads storage and the store.
    env: concat(commonEnv, roleEnv.controller, [
      {
        name: 'OTEL_SERVICE_NAME'
        value: 'billing-console'
      }
    ])
    tokenSecretUrl: empty(consoleTokenSecretName) ? '' : '${vault.properties.vaultUri}secrets/${consoleTokenSecretName}'
    externalIngress: consoleExternalIngress
    port: consolePort
  }
  dependsOn: [
    queues
    containers
    queueDataContributor
    blobDataContributor
    metricsPublisher
    acrPull
    vaultSecretsUser
    postgresIdentityAdmin
    database
    postgresFirewall
  ]
}

// ---- the identity's role assignments, on the resources they concern -----------------------------

resource queueDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: storage
  name: guid(storage.id, identity.id, storageQueueDataContributor)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataContributor)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

resource blobDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: storage
  name: guid(storage.id, identity.id, storageBlobDataContributor)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

resource topicSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: topic
  name: guid(topic.id, identity.id, serviceBusDataSender)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

resource topicReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: topic
  name: guid(topic.id, identity.id, serviceBusDataReceiver)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

// Telemetry into Application Insights with an Entra token (local authentication is off).
resource metricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: appInsights
  name: guid(appInsights.id, identity.id, monitoringMetricsPublisher)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisher)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

// The console's token: the platform reads the secret as the identity.
resource vaultSecretsUser 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: vault
  name: guid(vault.id, identity.id, keyVaultSecretsUser)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUser)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

// The apps pull the image as the identity.
resource acrPull 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (createRegistry) {
  scope: registry
  name: guid(registry.id, identity.id, acrPullRole)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', acrPullRole)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

// ---- outputs: names and endpoints only --------------------------------------------------------

@description('Client id of the roles\' identity (AZURE_CLIENT_ID).')
output identityClientId string = identity.properties.clientId

@description('BILLING_STORAGE_ACCOUNT_URL for `billing submit` and `billing status` from a workstation.')
output storageAccountUrl string = storage.properties.primaryEndpoints.queue

@description('BILLING_SERVICEBUS_NAMESPACE.')
output serviceBusNamespace string = '${serviceBus.name}.servicebus.windows.net'

@description('PostgreSQL host (private: reachable from the virtual network and networks peered with it and linked to its DNS zone; public: from the firewall rules\' addresses).')
output postgresHost string = postgres.properties.fullyQualifiedDomainName

@description('The virtual network an AKS cluster peers with to reach a private PostgreSQL (deploy/azure/aks-identity.sh).')
output vnetName string = vnet.name

@description('The identity\'s name: its PostgreSQL role, and the identity to federate with an AKS cluster\'s service accounts.')
output identityName string = identity.name

@description('The Container Apps, one per role (none with deployApps false).')
output appNames array = [for role in roles: deployApps ? '${namePrefix}-${role.name}' : '']

@description('Host name of the console (internal ingress: from the environment; external: from the virtual network).')
output consoleFqdn string = deployApps && deployConsole ? console.outputs.fqdn : ''

@description('The Key Vault that holds the console token (az keyvault secret set --vault-name ...).')
output keyVaultName string = vault.name

@description('Login server of the registry to push the image to (empty when none is created).')
output registryLoginServer string = createRegistry ? pullServer : ''

@description('The alert rules.')
output alertRuleNames array = alerts.outputs.names
