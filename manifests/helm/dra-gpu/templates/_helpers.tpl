{{/* Names, labels and computed values shared by the templates. */}}

{{- define "dra-gpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dra-gpu.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dra-gpu.namespace" -}}
{{- default .Release.Namespace .Values.namespace -}}
{{- end -}}

{{- define "dra-gpu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "dra-gpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dra-gpu
{{- end -}}

{{- define "dra-gpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-gpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dra-gpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "dra-gpu.kubeletPlugin.name" -}}
{{- printf "%s-kubelet-plugin" (include "dra-gpu.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dra-gpu.kubeletPlugin.serviceAccountName" -}}
{{- if .Values.kubeletPlugin.serviceAccount.create -}}
{{- default (include "dra-gpu.kubeletPlugin.name" .) .Values.kubeletPlugin.serviceAccount.name -}}
{{- else -}}
{{- required "kubeletPlugin.serviceAccount.name is required when kubeletPlugin.serviceAccount.create is false" .Values.kubeletPlugin.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "dra-gpu.webhook.name" -}}
{{- printf "%s-webhook" (include "dra-gpu.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dra-gpu.webhook.serviceAccountName" -}}
{{- if .Values.webhook.serviceAccount.create -}}
{{- default (include "dra-gpu.webhook.name" .) .Values.webhook.serviceAccount.name -}}
{{- else -}}
{{- required "webhook.serviceAccount.name is required when webhook.serviceAccount.create is false" .Values.webhook.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "dra-gpu.webhook.tlsSecretName" -}}
{{- if eq .Values.webhook.tls.mode "secret" -}}
{{- .Values.webhook.tls.secretName -}}
{{- else -}}
{{- printf "%s-tls" (include "dra-gpu.webhook.name" .) -}}
{{- end -}}
{{- end -}}

{{/* The host driver root: the value, or by default "/" for real GPUs and a dedicated directory when simulated. */}}
{{- define "dra-gpu.driverRoot" -}}
{{- if .Values.nvidiaDriverRoot -}}
{{- clean .Values.nvidiaDriverRoot -}}
{{- else if eq .Values.hardware "real" -}}
/
{{- else -}}
/var/lib/dra-gpu/sim-root
{{- end -}}
{{- end -}}

{{/*
Inside the plugin container the host driver root is mounted at the same path, so that the paths the plugin
writes into CDI specs are valid on the host; the host root "/" cannot be mounted over the container's root,
so it goes to /driver-root.
*/}}
{{- define "dra-gpu.driverRootMountPath" -}}
{{- $root := include "dra-gpu.driverRoot" . -}}
{{- if eq $root "/" -}}
/driver-root
{{- else -}}
{{- $root -}}
{{- end -}}
{{- end -}}
