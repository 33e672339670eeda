{{/* The service account's user name, as the API server sees it. */}}
{{- define "nri-shim.user" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ .Values.name }}
{{- end -}}
