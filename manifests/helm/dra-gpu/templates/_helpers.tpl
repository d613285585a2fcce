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

{{- /* `namespace`, or NVIDIA's `namespaceOverride` (the same meaning; validate.yaml refuses two different
ones), or the release namespace. */ -}}
{{- define "dra-gpu.namespace" -}}
{{- .Values.namespace | default .Values.namespaceOverride | default .Release.Namespace -}}
{{- end -}}

{{- define "dra-gpu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "dra-gpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dra-gpu
{{- end -}}

{{- /* The labels that select the release's pods; each workload adds app.kubernetes.io/component. NVIDIA's
selectorLabelsOverride replaces them (as NVIDIA's chart replaces its selector label with it); the component
label stays, so that the webhook's Service, PodDisruptionBudget and anti-affinity never pick plugin pods. */ -}}
{{- define "dra-gpu.selectorLabels" -}}
{{- if .Values.selectorLabelsOverride -}}
{{- toYaml .Values.selectorLabelsOverride -}}
{{- else -}}
app.kubernetes.io/name: {{ include "dra-gpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- end -}}

{{- define "dra-gpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "dra-gpu.kubeletPlugin.name" -}}
{{- printf "%s-kubelet-plugin" (include "dra-gpu.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /*
The kubelet plugin's ServiceAccount. NVIDIA's top-level `serviceAccount` is the one of NVIDIA's kubelet plugin
(its controller's too, which dra-gpu does not have): `create: false` creates none, `name: N` names it
N-kubeletplugin (NVIDIA's suffix; with create false and no name: default-kubeletplugin, as NVIDIA's chart),
`annotations` go on it. kubeletPlugin.serviceAccount.name, when set, wins over NVIDIA's name.
*/ -}}
{{- define "dra-gpu.kubeletPlugin.createServiceAccount" -}}
{{- if and .Values.kubeletPlugin.serviceAccount.create (dig "create" true (.Values.serviceAccount | default dict)) -}}
true
{{- end -}}
{{- end -}}

{{- define "dra-gpu.kubeletPlugin.serviceAccountName" -}}
{{- $nvidia := .Values.serviceAccount | default dict -}}
{{- if .Values.kubeletPlugin.serviceAccount.name -}}
{{- .Values.kubeletPlugin.serviceAccount.name -}}
{{- else if or (dig "name" "" $nvidia) (not (dig "create" true $nvidia)) -}}
{{- printf "%s-kubeletplugin" (dig "name" "" $nvidia | default "default") -}}
{{- else if .Values.kubeletPlugin.serviceAccount.create -}}
{{- include "dra-gpu.kubeletPlugin.name" . -}}
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
{{- /* As NVIDIA's chart: the namespace's default account (the webhook needs no API rights, nor a token). */ -}}
{{- .Values.webhook.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "dra-gpu.webhook.tlsSecretName" -}}
{{- if eq .Values.webhook.tls.mode "secret" -}}
{{- .Values.webhook.tls.secretName | default (dig "secret" "name" "" .Values.webhook.tls) -}}
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

{{/* mode=secret: the CA bundle, from webhook.tls.caBundle or NVIDIA's webhook.tls.secret.caBundle. */}}
{{- define "dra-gpu.webhook.caBundle" -}}
{{- .Values.webhook.tls.caBundle | default (dig "secret" "caBundle" "" .Values.webhook.tls) -}}
{{- end -}}

{{/* The webhook container's port: NVIDIA's webhook.containerPort when given, else webhook.port. */}}
{{- define "dra-gpu.webhook.port" -}}
{{- .Values.webhook.containerPort | default .Values.webhook.port | int -}}
{{- end -}}

{{/* The port of the webhook's Service (and of the API server's calls): NVIDIA's webhook.servicePort, 443. */}}
{{- define "dra-gpu.webhook.servicePort" -}}
{{- .Values.webhook.servicePort | default 443 | int -}}
{{- end -}}

{{/*
mode=cert-manager: the issuer of the serving Certificate as YAML ({kind, name}), or nothing for the chart's
own self-signed CA. webhook.tls.certManager.issuerRef, or NVIDIA's issuerType (selfsigned: the chart's own
CA; clusterissuer / issuer: the ClusterIssuer / Issuer named issuerName).
*/}}
{{- define "dra-gpu.webhook.issuerRef" -}}
{{- $cm := .Values.webhook.tls.certManager -}}
{{- $type := $cm.issuerType | default "selfsigned" -}}
{{- if $cm.issuerRef -}}
{{- if ne $type "selfsigned" -}}
{{- fail (printf "webhook.tls.certManager.issuerRef and NVIDIA's webhook.tls.certManager.issuerType=%s both name the webhook certificate's issuer: keep one (issuerRef {kind, name}, or issuerType with issuerName)" $type) -}}
{{- end -}}
{{- toYaml $cm.issuerRef -}}
{{- else if ne $type "selfsigned" -}}
{{- if not $cm.issuerName -}}
{{- fail (printf "webhook.tls.certManager.issuerType=%s needs webhook.tls.certManager.issuerName: the name of the existing cert-manager %s that signs the webhook certificate (or issuerType selfsigned for the chart's own CA)" $type (ternary "ClusterIssuer" "Issuer" (eq $type "clusterissuer"))) -}}
{{- end -}}
kind: {{ ternary "ClusterIssuer" "Issuer" (eq $type "clusterissuer") }}
name: {{ $cm.issuerName }}
{{- end -}}
{{- end -}}
