{{/*
The chart's names and labels, and the gateway's config as the ConfigMap
holds it.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "switchboard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' base name: fullnameOverride, else the release name when it
already holds the chart name (release "switchboard" gives "switchboard",
the base's names), else release-chart.
*/}}
{{- define "switchboard.fullname" -}}
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

{{/* What the Deployment, its Services and its PodDisruptionBudget select: the gateway's pods. */}}
{{- define "switchboard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "switchboard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end }}

{{/* Every object's labels but the component. */}}
{{- define "switchboard.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "switchboard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: switchboard
{{- end }}

{{/* The gateway's objects' labels. */}}
{{- define "switchboard.labels" -}}
{{ include "switchboard.commonLabels" . }}
app.kubernetes.io/component: gateway
{{- end }}

{{/* The admin listener's objects' labels (what the ServiceMonitor selects). */}}
{{- define "switchboard.adminLabels" -}}
{{ include "switchboard.commonLabels" . }}
app.kubernetes.io/component: admin
{{- end }}

{{/* The ServiceAccount the pods run as. */}}
{{- define "switchboard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "switchboard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image: repository@digest, else repository:tag (tag "" = "v" + appVersion). */}}
{{- define "switchboard.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default (printf "v%s" .Chart.AppVersion) .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The admin tokens' Secret: existingSecret, else the one the chart creates,
else "". Both set fails: one of them would be ignored.
*/}}
{{- define "switchboard.adminTokenSecret" -}}
{{- if and .Values.adminToken.existingSecret .Values.adminToken.create }}
{{- fail (printf "adminToken.existingSecret (%s) and adminToken.create are both set: keep existingSecret and set create to false, or drop existingSecret to let the chart create the Secret from adminToken.tokens" .Values.adminToken.existingSecret) }}
{{- end }}
{{- if .Values.adminToken.existingSecret }}
{{- .Values.adminToken.existingSecret }}
{{- else if .Values.adminToken.create }}
{{- printf "%s-admin-token" (include "switchboard.fullname" .) }}
{{- end }}
{{- end }}

{{/* Where the admin tokens' Secret is mounted. */}}
{{- define "switchboard.adminTokenDir" -}}
/etc/switchboard-admin
{{- end }}

{{/*
The read-only admin tokens' Secret: existingSecret, else the one the
chart creates, else "". Both set fails: one of them would be ignored.
*/}}
{{- define "switchboard.adminReadTokenSecret" -}}
{{- if and .Values.adminReadToken.existingSecret .Values.adminReadToken.create }}
{{- fail (printf "adminReadToken.existingSecret (%s) and adminReadToken.create are both set: keep existingSecret and set create to false, or drop existingSecret to let the chart create the Secret from adminReadToken.tokens" .Values.adminReadToken.existingSecret) }}
{{- end }}
{{- if .Values.adminReadToken.existingSecret }}
{{- .Values.adminReadToken.existingSecret }}
{{- else if .Values.adminReadToken.create }}
{{- printf "%s-admin-read-token" (include "switchboard.fullname" .) }}
{{- end }}
{{- end }}

{{/* Where the read-only admin tokens' Secret is mounted (beside, not inside, the other mounts). */}}
{{- define "switchboard.adminReadTokenDir" -}}
/etc/switchboard-admin-read
{{- end }}

{{/*
The token volumes' file mode, in decimal (the API takes an integer). The
files are owned by root, group root unless the pod sets fsGroup: with
podSecurityContext.fsGroup, 0440 (owner and that group; the gateway, uid
65532, reads them through the group the kubelet gives them and adds to
the container's groups); without it, as in the base, 0444, since 0440
would leave them unreadable to the non-root gateway. The container runs
the gateway alone, so "others" is nobody else.
*/}}
{{- define "switchboard.tokenFileMode" -}}
{{- if (.Values.podSecurityContext | default dict).fsGroup }}288{{ else }}292{{ end }}
{{- end }}

{{/* The variable holding the Redis password (not SWITCHBOARD_*: the gateway reads those as config keys). */}}
{{- define "switchboard.redisPasswordEnv" -}}
REDIS_PASSWORD
{{- end }}

{{/*
Whether discovery reads pods ("true" or ""): unless role_label and
group_label are both "" (role_label defaults to llm-d.ai/role), the Role
needs list and watch on pods.
*/}}
{{- define "switchboard.discoveryReadsPods" -}}
{{- $k := .Values.discovery.kubernetes | default dict }}
{{- $role := ternary (get $k "role_label") "llm-d.ai/role" (hasKey $k "role_label") }}
{{- if or $role (get $k "group_label") }}true{{ end }}
{{- end }}

{{/*
The gateway's config: .Values.config with the listeners from
containerPorts, discovery.kubernetes from .Values.discovery, Redis from
.Values.redis and the admin tokens files from .Values.adminToken and
.Values.adminReadToken. Set with
`set`, not mergeOverwrite, which would not write a false.
*/}}
{{- define "switchboard.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- $server := get $cfg "server" | default dict }}
{{- $_ := set $server "listen" (printf ":%v" .Values.containerPorts.http) }}
{{- $_ = set $cfg "server" $server }}
{{- $admin := get $cfg "admin" | default dict }}
{{- $_ = set $admin "listen" (printf ":%v" .Values.containerPorts.admin) }}
{{- if include "switchboard.adminTokenSecret" . }}
{{- $auth := get $admin "auth" | default dict }}
{{- $_ = set $auth "tokens_file" (printf "%s/%s" (include "switchboard.adminTokenDir" .) .Values.adminToken.key) }}
{{- $_ = set $admin "auth" $auth }}
{{- end }}
{{- if include "switchboard.adminReadTokenSecret" . }}
{{- $auth := get $admin "auth" | default dict }}
{{- $_ = set $auth "read_tokens_file" (printf "%s/%s" (include "switchboard.adminReadTokenDir" .) .Values.adminReadToken.key) }}
{{- $_ = set $admin "auth" $auth }}
{{- end }}
{{- $_ = set $cfg "admin" $admin }}
{{- $discovery := get $cfg "discovery" | default dict }}
{{- if .Values.discovery.enabled }}
{{- $kube := deepCopy (.Values.discovery.kubernetes | default dict) }}
{{- $_ = set $kube "enabled" true }}
{{- $_ = set $discovery "kubernetes" $kube }}
{{- else }}
{{- $_ = set $discovery "kubernetes" (dict "enabled" false) }}
{{- end }}
{{- $_ = set $cfg "discovery" $discovery }}
{{- if .Values.redis.address }}
{{- $limits := get $cfg "limits" | default dict }}
{{- $redis := get $limits "redis" | default dict }}
{{- $_ = set $redis "address" .Values.redis.address }}
{{- if .Values.redis.passwordSecret.name }}
{{- $_ = set $redis "password_env" (include "switchboard.redisPasswordEnv" .) }}
{{- end }}
{{- $_ = set $limits "redis" $redis }}
{{- $_ = set $cfg "limits" $limits }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}
