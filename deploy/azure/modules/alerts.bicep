// The pipeline's alert rules, as log search alerts on the Log Analytics workspace that holds both the
// storage account's queue logs (StorageQueueLogs, from the queue service's diagnostic settings) and
// the roles' telemetry (AppMetrics, from the workspace-based Application Insights):
//   - poison: a message sits in a poison queue (more put into it than deleted or cleared in the last day);
//   - backlog: a pipeline queue holds work and has made no progress (no message deleted from it since
//     the oldest one waiting was put) for longer than backlogAgeMinutes;
//   - failed batch: the controller settled a batch as failed (the billing.batches counter, state failed).
// Each fires to the action group when alertEmail is given; the alerts show in Azure Monitor either way.

@description('Azure region of the rules.')
param location string

@description('Resource id of the Log Analytics workspace the rules query.')
param workspaceId string

@description('The storage account whose queue logs the poison and backlog rules read.')
param storageAccountName string

@description('BILLING_QUEUE_PREFIX: the pipeline\'s queues start with it.')
param queuePrefix string

@description('Short prefix of the rules\' names.')
param namePrefix string

@description('Minutes a queue may hold work without progress before the backlog rule fires.')
@minValue(5)
param backlogAgeMinutes int

@description('E-mail address the alerts are sent to; empty: no action group, the alerts show in Azure Monitor only.')
param alertEmail string

// KQL, one line each: the queue is the second segment of a queue log's ObjectKey (/<account>/<queue>/...).
var queueLogs = 'StorageQueueLogs | where AccountName == "${storageAccountName}" | extend queue = tostring(split(ObjectKey, "/")[2]) | where queue startswith "${queuePrefix}-"'

var rules = [
  {
    name: 'poison'
    displayName: 'billing: messages in a poison queue'
    description: 'A pipeline message was moved to a poison queue and is still there: see `billing poison list`, then replay or purge it.'
    severity: 1
    evaluationFrequency: 'PT15M'
    windowSize: 'P1D'
    query: '${queueLogs} | where queue endswith "-poison" | summarize added = countif(OperationName == "PutMessage"), removed = countif(OperationName in ("DeleteMessage", "ClearMessages")) by queue | where added > removed'
  }
  {
    name: 'backlog-age'
    displayName: 'billing: a queue holds work without progress'
    description: 'A pipeline queue got work ${backlogAgeMinutes} minutes ago or more and no message has been deleted from it since: no role is taking it (scaling, identity or a crash loop).'
    severity: 2
    evaluationFrequency: 'PT5M'
    windowSize: 'PT6H'
    query: 'let activity = ${queueLogs} | where not(queue endswith "-poison"); activity | where OperationName == "PutMessage" | join kind=leftouter (activity | where OperationName == "DeleteMessage" | summarize lastDelete = max(TimeGenerated) by queue) on queue | where isnull(lastDelete) or TimeGenerated > lastDelete | summarize oldest = min(TimeGenerated) by queue | where oldest < ago(${backlogAgeMinutes}m)'
  }
  {
    name: 'batch-failed'
    displayName: 'billing: a batch failed'
    description: 'The controller settled a batch as failed (poisoned work items): see `billing status` and `billing poison list`.'
    severity: 1
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    query: 'AppMetrics | where Name == "billing.batches" and tostring(Properties.state) == "failed" | summarize failed = sum(Sum) | where failed > 0'
  }
]

resource actionGroup 'Microsoft.Insights/actionGroups@2023-01-01' = if (!empty(alertEmail)) {
  name: '${namePrefix}-alerts'
  location: 'global'
  properties: {
    groupShortName: take(replace(namePrefix, '-', ''), 12)
    enabled: true
    emailReceivers: [
      {
        name: 'operators'
        emailAddress: alertEmail
        useCommonAlertSchema: true
      }
    ]
  }
}

resource alertRules 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = [
  for rule in rules: {
    name: '${namePrefix}-${rule.name}'
    location: location
    kind: 'LogAlert'
    properties: {
      displayName: rule.displayName
      description: rule.description
      severity: rule.severity
      enabled: true
      scopes: [
        workspaceId
      ]
      evaluationFrequency: rule.evaluationFrequency
      windowSize: rule.windowSize
      criteria: {
        allOf: [
          {
            query: rule.query
            timeAggregation: 'Count'
            operator: 'GreaterThan'
            threshold: 0
            failingPeriods: {
              numberOfEvaluationPeriods: 1
              minFailingPeriodsToAlert: 1
            }
          }
        ]
      }
      autoMitigate: true
      actions: {
        actionGroups: empty(alertEmail) ? [] : [
          actionGroup.id
        ]
      }
    }
  }
]

@description('Names of the alert rules.')
output names array = [for (rule, i) in rules: alertRules[i].name]
