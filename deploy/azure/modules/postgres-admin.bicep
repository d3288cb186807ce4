// One Entra administrator of a PostgreSQL Flexible Server. A module because the administrator's
// name is its object id, which for an identity made in the same deployment is known only at run time.

@description('The PostgreSQL Flexible Server.')
param serverName string

@description('Object id of the Entra principal.')
param objectId string

@description('Its name: the PostgreSQL role it logs in as.')
param principalName string

@description('Kind of the principal.')
@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param principalType string

resource server 'Microsoft.DBforPostgreSQL/flexibleServers@2024-08-01' existing = {
  name: serverName
}

resource administrator 'Microsoft.DBforPostgreSQL/flexibleServers/administrators@2024-08-01' = {
  parent: server
  name: objectId
  properties: {
    principalName: principalName
    principalType: principalType
    tenantId: subscription().tenantId
  }
}
