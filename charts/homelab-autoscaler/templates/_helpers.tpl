{{- define "homelab-autoscaler.labels" -}}
app.kubernetes.io/name: homelab-autoscaler
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
{{- define "homelab-autoscaler.selector" -}}
app.kubernetes.io/name: homelab-autoscaler
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
