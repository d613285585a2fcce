{{/* The MPS daemon pods (kubeletPlugin.mps.daemonMode=pod): what the plugin is told to make, and what the
admission policy (mps-daemon-pod-policy.yaml) lets it make; both come from these definitions. */}}

{{- define "dra-gpu.mpsDaemon.image" -}}
{{- $image := .Values.kubeletPlugin.mps.daemonPod.image -}}
{{- printf "%s:%s" (default .Values.image.repository $image.repository) (default (default .Chart.AppVersion .Values.image.tag) $image.tag) -}}
{{- end -}}

{{- define "dra-gpu.mpsDaemon.pullPolicy" -}}
{{- default .Values.image.pullPolicy .Values.kubeletPlugin.mps.daemonPod.image.pullPolicy -}}
{{- end -}}

{{- define "dra-gpu.mpsDaemon.serviceAccountName" -}}
{{- printf "%s-mps-daemon" (include "dra-gpu.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Where the plugin keeps each daemon's pipe, log and shared memory directories on the host. */}}
{{- define "dra-gpu.mpsDaemon.hostDir" -}}
{{- /* kubeletPlugin.kubeletPluginsDirectoryPath (NVIDIA's key) moves the plugins directory off kubeletDir */ -}}
{{- $plugins := .Values.kubeletPlugin.kubeletPluginsDirectoryPath | default (printf "%s/plugins" (clean .Values.kubeletDir)) -}}
{{- printf "%s/gpu.nvidia.com/mps/" (clean $plugins) -}}
{{- end -}}

{{/* The tolerations a daemon pod gets: the node lifecycle ones (in the plugin: NODE_LIFECYCLE_TOLERATIONS)
and the plugin's own, as a JSON list. */}}
{{- define "dra-gpu.mpsDaemon.tolerations" -}}
{{- $lifecycle := list
  (dict "key" "node.kubernetes.io/not-ready" "operator" "Exists" "effect" "NoExecute")
  (dict "key" "node.kubernetes.io/unreachable" "operator" "Exists" "effect" "NoExecute") -}}
{{- concat $lifecycle (.Values.kubeletPlugin.tolerations | default list) | toJson -}}
{{- end -}}
