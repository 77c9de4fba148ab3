{{/* Names are capped at 63 characters (DNS label) minus room for the longest suffix. */}}
{{- define "ccltune.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ccltune.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ccltune.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Recommended labels: https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/ */}}
{{- define "ccltune.labels" -}}
helm.sh/chart: {{ include "ccltune.chart" . }}
app.kubernetes.io/name: {{ include "ccltune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ccltune
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels must never change between upgrades (Deployment selectors are immutable). */}}
{{- define "ccltune.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ccltune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ccltune.operatorSelectorLabels" -}}
{{ include "ccltune.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels with a component: call with (dict "ctx" $ "component" "agent"). */}}
{{- define "ccltune.componentLabels" -}}
{{ include "ccltune.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* An image override with its own repository takes only its own tag/digest: the top-level digest
     belongs to the top-level repository. */}}
{{- define "ccltune.image" -}}
{{- $img := .image -}}
{{- $root := .root -}}
{{- $repo := $root.Values.image.repository -}}
{{- $digest := default $root.Values.image.digest $img.digest -}}
{{- $tag := default (default $root.Chart.AppVersion $root.Values.image.tag) $img.tag -}}
{{- if $img.repository -}}
{{- $repo = $img.repository -}}
{{- $digest = $img.digest -}}
{{- $tag = default $root.Chart.AppVersion $img.tag -}}
{{- end -}}
{{- if $digest -}}
{{ $repo }}@{{ $digest }}
{{- else -}}
{{ $repo }}:{{ $tag }}
{{- end -}}
{{- end }}

{{- define "ccltune.operatorImage" -}}
{{ include "ccltune.image" (dict "image" (dict) "root" .) }}
{{- end }}

{{- define "ccltune.agentImage" -}}
{{ include "ccltune.image" (dict "image" .Values.agent.image "root" .) }}
{{- end }}

{{/* The unpack init container runs the agent image unless webhook.unpack.image says otherwise. */}}
{{- define "ccltune.unpackImage" -}}
{{- $img := .Values.webhook.unpack.image -}}
{{- if or $img.repository $img.tag $img.digest -}}
{{ include "ccltune.image" (dict "image" $img "root" .) }}
{{- else -}}
{{ include "ccltune.agentImage" . }}
{{- end -}}
{{- end }}

{{- define "ccltune.serviceAccountName" -}}
{{- $sa := index .ctx.Values .component "serviceAccount" -}}
{{- if $sa.create -}}
{{ default (printf "%s-%s" (include "ccltune.fullname" .ctx) .component) $sa.name }}
{{- else -}}
{{ default "default" $sa.name }}
{{- end -}}
{{- end }}

{{- define "ccltune.webhookServiceName" -}}
{{ include "ccltune.fullname" . }}-webhook
{{- end }}

{{- define "ccltune.webhookSecretName" -}}
{{- if eq .Values.webhook.certificate.source "secret" -}}
{{ .Values.webhook.certificate.secretName }}
{{- else -}}
{{ include "ccltune.fullname" . }}-webhook-tls
{{- end -}}
{{- end }}

{{- define "ccltune.agentConfigMapName" -}}
{{ include "ccltune.fullname" . }}-agent
{{- end }}

{{- define "ccltune.jobsConfigMapName" -}}
{{ include "ccltune.fullname" . }}-jobs
{{- end }}

{{/* kopf serves each admission handler at /<handler id> (kopf/_core/engines/admission.py);
     the pod handler in operator/ccltune/controller/main.py has id "inject". */}}
{{- define "ccltune.webhookPath" -}}
/inject
{{- end }}

{{/* The operator's config file (OperatorConfig fields, snake_case). */}}
{{- define "ccltune.operatorConfig" -}}
{{- $op := .Values.operator -}}
{{- $cfg := dict
  "namespace" .Release.Namespace
  "operator_image" (include "ccltune.operatorImage" .)
  "agent_image" (include "ccltune.agentImage" .)
  "image_pull_policy" .Values.image.pullPolicy
  "agent_service_account" (include "ccltune.serviceAccountName" (dict "ctx" . "component" "agent"))
  "agent_resources" .Values.agent.resources
  "agent_tolerations" .Values.agent.tolerations
  "agent_args" (concat (list "run" "--sysfs-root=/host" "--cpuinfo=/proc/cpuinfo" (printf "--health-addr=0.0.0.0:%v" .Values.agent.healthPort) (printf "--interval=%v" .Values.agent.probeIntervalSeconds)) .Values.agent.args)
  "agent_health_port" .Values.agent.healthPort
  "gpu_node_label" .Values.agent.gpuNodeLabel
  "job_service_account" (include "ccltune.serviceAccountName" (dict "ctx" . "component" "jobs"))
  "job_resources" .Values.jobs.resources
  "job_backoff_limit" .Values.jobs.backoffLimit
  "job_ttl_seconds" .Values.jobs.ttlSecondsAfterFinished
  "synthesis_max_shards" .Values.jobs.synthesis.maxShards
  "synthesis_shard_work" .Values.jobs.synthesis.shardWork
  "inprocess_max_gpus" $op.inprocess.maxGpus
  "inprocess_max_synth_gpus" $op.inprocess.maxSynthGpus
  "inprocess_max_trials" $op.inprocess.maxTrials
  "inprocess_concurrency" $op.inprocess.concurrency
  "inprocess_max_work" $op.inprocess.maxWork
  "max_plan_work" $op.limits.maxPlanWork
  "topology_timeout_seconds" $op.topologyTimeoutSeconds
  "metrics_port" $op.metricsPort
  "webhook_port" .Values.webhook.port
  "webhook_failure_policy" .Values.webhook.failurePolicy
  "webhook_api_timeout_seconds" (max 1 (sub (int .Values.webhook.timeoutSeconds) 1))
  "heal_interval_seconds" $op.healIntervalSeconds
  "log_format" $op.logFormat
  "unpack_image" (include "ccltune.unpackImage" .)
  "unpack_resources" .Values.webhook.unpack.resources
  "benchmark_gpu_resource" .Values.benchmark.gpuResource
  "benchmark_grace_seconds" .Values.benchmark.graceSeconds
-}}
{{- with .Values.benchmark.image }}
{{- $_ := set $cfg "benchmark_image" . }}
{{- end }}
{{- if .Values.webhook.enabled }}
{{- $_ := set $cfg "webhook_addr" "0.0.0.0" }}
{{- $_ := set $cfg "webhook_host" (printf "%s.%s.svc" (include "ccltune.webhookServiceName" .) .Release.Namespace) }}
{{- $_ := set $cfg "webhook_certfile" "/etc/ccltune/webhook/tls.crt" }}
{{- $_ := set $cfg "webhook_keyfile" "/etc/ccltune/webhook/tls.key" }}
{{- else }}
{{- /* kopf always starts its webhook server; with the webhook off it listens on loopback only,
       where nothing can reach it, so it needs no certificate. */}}
{{- $_ := set $cfg "webhook_addr" "127.0.0.1" }}
{{- $_ := set $cfg "webhook_insecure" true }}
{{- end }}
{{- with .Values.agent.priorityClassName }}
{{- $_ := set $cfg "agent_priority_class" . }}
{{- end }}
{{- toYaml (mergeOverwrite $cfg $op.extraConfig) }}
{{- end }}

{{/* kopf run arguments: standalone (one replica, no peering objects), health endpoint, scope. */}}
{{- define "ccltune.operatorArgs" -}}
- --standalone
{{- /* kopf's own lines before the operator's config is read; same format after. */}}
- --log-format={{ if eq .Values.operator.logFormat "text" }}full{{ else }}json{{ end }}
{{- if eq .Values.operator.logLevel "debug" }}
- --debug
{{- else if eq .Values.operator.logLevel "warning" }}
- --quiet
{{- end }}
- --liveness=http://0.0.0.0:{{ .Values.operator.healthPort }}/healthz
{{- if .Values.operator.watchNamespaces }}
{{- /* The release namespace is always watched: the agent DaemonSet's repair handler lives there. */}}
{{- range (append .Values.operator.watchNamespaces .Release.Namespace | uniq) }}
- --namespace={{ . }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
- -m
- ccltune.controller.main
{{- end }}
