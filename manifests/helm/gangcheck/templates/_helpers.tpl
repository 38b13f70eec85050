{{/* The release's full name: the release name when it already says gangcheck. */}}
{{- define "gangcheck.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gangcheck.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "gangcheck.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gangcheck.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{- define "gangcheck.leaseName" -}}
{{- .Values.leaderElection.leaseName | default (include "gangcheck.fullname" .) -}}
{{- end -}}

{{/* The Secret holding the webhook's serving certificate. */}}
{{- define "gangcheck.webhookSecret" -}}
{{- .Values.webhook.secretName | default (printf "%s-webhook-cert" (include "gangcheck.fullname" .)) -}}
{{- end -}}

{{/* role: dispatcher: its ServiceAccount, RBAC objects and Deployment share this name. */}}
{{- define "gangcheck.dispatcherName" -}}
{{- printf "%s-dispatcher" (include "gangcheck.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gangcheck.dispatcherSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: dispatcher
{{- end -}}

{{- define "gangcheck.dispatcherLeaseName" -}}
{{- .Values.leaderElection.leaseName | default (include "gangcheck.dispatcherName" .) -}}
{{- end -}}
