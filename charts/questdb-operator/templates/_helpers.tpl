{{/*
The chart name (app.kubernetes.io/name), `questdb-operator` unless nameOverride.
*/}}
{{- define "questdb-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The object name prefix. The release `questdb-operator` gives `questdb-operator`: the names of
deploy/ (the kustomize install), which tests/helm_chart.rs compares with.
*/}}
{{- define "questdb-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The name of cluster-scoped objects (ClusterRole, admission policy). A cluster-wide install is
one per cluster and keeps the full name; namespaced installs may be many (one per team), so
theirs carry the namespace.
*/}}
{{- define "questdb-operator.clusterScopedName" -}}
{{- if eq .Values.rbac.scope "namespace" }}
{{- printf "%s-%s" .Release.Namespace (include "questdb-operator.fullname" .) }}
{{- else }}
{{- include "questdb-operator.fullname" . }}
{{- end }}
{{- end }}

{{- define "questdb-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object: deploy/'s app.kubernetes.io/name plus Helm's own.
*/}}
{{- define "questdb-operator.labels" -}}
helm.sh/chart: {{ include "questdb-operator.chart" . }}
app.kubernetes.io/name: {{ include "questdb-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
The operator pods' labels and every selector of them: deploy/'s, so a kustomize install can be
taken over by the chart (a Deployment's selector is immutable).
*/}}
{{- define "questdb-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "questdb-operator.name" . }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "questdb-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "questdb-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "questdb-operator.image" -}}
{{- $_ := required "image.repository is required: the registry path you pushed the operator image to (docs/operations/install.md: the image, built and pushed); no image is published for you" .Values.image.repository }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The operator's arguments: `run`, deploy/'s three, then one `--flag=value` per value that is set
(null and "" are unset, except for csi-driver where "" turns the wait off), then extraArgs. A
list is joined with commas (the operator's value delimiter); a number is printed as an integer
(values files give float64, which %v would print as 1e+06).
*/}}
{{- define "questdb-operator.args" -}}
{{- $v := .Values }}
{{- $aws := $v.aws }}
{{- $nodes := $v.nodes }}
{{- /* nodes.upgrade is nodes.move's name before node moves were called so: read for one release. */}}
{{- $move := $nodes.move | default dict }}
{{- $old := $nodes.upgrade | default dict }}
{{- $args := list "run" }}
{{- if $v.leaderElection.enabled }}
{{- $args = append $args "--leader-elect" }}
{{- end }}
{{- $args = append $args (printf "--metrics-bind-address=:%d" (int64 $v.metrics.port)) }}
{{- $args = append $args (printf "--health-probe-bind-address=:%d" (int64 $v.health.port)) }}
{{- $subnets := "" }}
{{- if $aws.subnets }}
{{- $subnets = include "questdb-operator.subnets" $aws.subnets }}
{{- end }}
{{- $publicSubnets := "" }}
{{- if $aws.publicSubnets }}
{{- $publicSubnets = include "questdb-operator.subnets" $aws.publicSubnets }}
{{- end }}
{{- $userData := "" }}
{{- if $nodes.userDataTemplate.configMap }}
{{- $userData = printf "%s/%s" (include "questdb-operator.userDataDir" .) $nodes.userDataTemplate.key }}
{{- end }}
{{- $kubeletCa := "" }}
{{- if $v.kubeletCa.configMap }}
{{- $kubeletCa = printf "%s/%s" (include "questdb-operator.kubeletCaDir" .) $v.kubeletCa.key }}
{{- end }}
{{- $flags := list
  (list "namespace" (ternary "" $v.watchNamespace (eq $v.rbac.scope "namespace")))
  (list "leader-election-id" $v.leaderElection.leaseName)
  (list "leader-elect-lease-duration" $v.leaderElection.leaseDurationSeconds)
  (list "leader-elect-renew-grace" $v.leaderElection.renewGraceSeconds)
  (list "questdb-concurrency" $v.concurrency.questdb)
  (list "node-health-concurrency" $v.concurrency.nodeHealth)
  (list "backup-concurrency" $v.concurrency.backup)
  (list "backup-schedule-concurrency" $v.concurrency.backupSchedule)
  (list "max-concurrent-operator-rollouts" $v.concurrency.operatorRollouts)
  (list "backup-checkpoint-timeout" $v.backup.checkpointTimeoutSeconds)
  (list "backup-checkpoint-create-timeout" $v.backup.checkpointCreateTimeoutSeconds)
  (list "backup-upload-timeout" $v.backup.uploadTimeoutSeconds)
  (list "backup-schedule-min-interval" $v.backup.scheduleMinInterval)
  (list "backup-retention-max" $v.backup.retentionMax)
  (list "write-health-interval" $v.writeHealthIntervalSeconds)
  (list "kubelet-ca-file" $kubeletCa)
  (list "cloud-provider" (ternary "" $v.cloudProvider (eq $v.cloudProvider "none")))
  (list "cluster-name" $aws.clusterName)
  (list "aws-region" $aws.region)
  (list "aws-endpoint-url" $aws.endpointUrl)
  (list "aws-subnets" $subnets)
  (list "aws-public-subnets" $publicSubnets)
  (list "aws-security-group-ids" $aws.securityGroupIds)
  (list "aws-instance-profile" $aws.instanceProfile)
  (list "node-tags" $nodes.tags)
  (list "route53-hosted-zone-id" $aws.route53HostedZoneId)
  (list "dns-namespace-suffix" $aws.dnsNamespaceSuffix)
  (list "dns-names-first-come" (ternary "true" "" $aws.dnsNamesFirstCome))
  (list "allowed-image-registries" $v.tenancy.allowedImageRegistries)
  (list "allowed-priority-classes" $v.tenancy.allowedPriorityClasses)
  (list "allowed-toleration-keys" $v.tenancy.allowedTolerationKeys)
  (list "secret-namespaces" (ternary $v.rbac.secretNamespaces (list) (eq $v.rbac.scope "cluster")))
  (list "eks-api-endpoint" $aws.eks.apiEndpoint)
  (list "eks-certificate-authority" $aws.eks.certificateAuthority)
  (list "eks-service-cidr" $aws.eks.serviceCidr)
  (list "allowed-node-images" $nodes.allowedImages)
  (list "allowed-node-image-owners" $nodes.allowedImageOwners)
  (list "allowed-node-instance-types" $nodes.allowedInstanceTypes)
  (list "node-user-data-template" $userData)
  (list "node-root-device-name" $nodes.rootVolume.deviceName)
  (list "node-root-volume-gib" $nodes.rootVolume.sizeGiB)
  (list "node-root-volume-kms-key-id" $nodes.rootVolume.kmsKeyId)
  (list "node-data-volume-gib" $nodes.dataVolume.sizeGiB)
  (list "node-lease-duration" $nodes.leaseDuration)
  (list "orphan-sweep-interval" $nodes.orphanSweepInterval)
  (list "scheduled-event-interval" $nodes.scheduledEventInterval)
  (list "orphan-grace-period" $nodes.orphanGracePeriod)
  (list "instance-sync-interval" $nodes.instanceSyncInterval)
  (list "node-join-timeout" $nodes.joinTimeout)
  (list "fence-graceful-stop-timeout" $nodes.fence.gracefulStopTimeout)
  (list "fence-stop-escalation" $nodes.fence.stopEscalation)
  (list "fence-detach-escalation" $nodes.fence.detachEscalation)
  (list "node-move-join-timeout" (coalesce $move.joinTimeout $old.nodeTimeout))
  (list "node-move-step-timeout" (coalesce $move.stepTimeout $old.stepTimeout))
  (list "node-move-concurrency" (coalesce $move.concurrency $old.concurrency))
  (list "node-move-concurrency-per-namespace" (coalesce $move.concurrencyPerNamespace $old.concurrencyPerNamespace))
  (list "max-dedicated-nodes-per-namespace" $nodes.maxPerNamespace)
}}
{{- range $flags }}
{{- $flag := index . 0 }}
{{- $value := index . 1 }}
{{- if kindIs "slice" $value }}
{{- if $value }}
{{- $args = append $args (printf "--%s=%s" $flag (join "," $value)) }}
{{- end }}
{{- else if or (kindIs "float64" $value) (kindIs "int64" $value) (kindIs "int" $value) }}
{{- $args = append $args (printf "--%s=%d" $flag (int64 $value)) }}
{{- else if not (or (kindIs "invalid" $value) (eq (toString $value) "")) }}
{{- $args = append $args (printf "--%s=%s" $flag (toString $value)) }}
{{- end }}
{{- end }}
{{- if not (kindIs "invalid" $nodes.csiDriver) }}
{{- $args = append $args (printf "--csi-driver=%s" (toString $nodes.csiDriver)) }}
{{- end }}
{{- toYaml (concat $args $v.extraArgs) }}
{{- end }}

{{/*
`zone=subnet,zone=subnet` from a zone -> subnet map (aws.subnets, aws.publicSubnets), zones sorted.
*/}}
{{- define "questdb-operator.subnets" -}}
{{- $pairs := list }}
{{- range $zone := keys . | sortAlpha }}
{{- $pairs = append $pairs (printf "%s=%s" $zone (index $ $zone)) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/*
Where the user-data template ConfigMap is mounted.
*/}}
{{- define "questdb-operator.userDataDir" -}}
/etc/questdb-operator/user-data
{{- end }}

{{/*
Where the kubelet CA ConfigMap is mounted.
*/}}
{{- define "questdb-operator.kubeletCaDir" -}}
/etc/questdb-operator/kubelet-ca
{{- end }}
