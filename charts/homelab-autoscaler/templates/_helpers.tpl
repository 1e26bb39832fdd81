{{- define "homelab-autoscaler.labels" -}}
app.kubernetes.io/name: homelab-autoscaler
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}
{{- define "homelab-autoscaler.selector" -}}
app.kubernetes.io/name: homelab-autoscaler
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The operator's image; the power-driver Jobs run the same one. */}}
{{- define "homelab-autoscaler.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The Secret the webhook serves from ("" in the self-managed mode). */}}
{{- define "homelab-autoscaler.webhookSecret" -}}
{{- if eq .Values.tls.mode "certManager" -}}homelab-autoscaler-webhook-tls
{{- else if eq .Values.tls.mode "secrets" -}}{{ required "tls.secrets.webhook is required with tls.mode=secrets" .Values.tls.secrets.webhook }}
{{- end -}}
{{- end }}

{{/* The Secret the gRPC provider serves mutual TLS from ("" when self-managed or plaintext). */}}
{{- define "homelab-autoscaler.grpcSecret" -}}
{{- if eq .Values.tls.mode "certManager" -}}homelab-autoscaler-grpc-tls
{{- else -}}{{ .Values.tls.secrets.grpc }}
{{- end -}}
{{- end }}

{{/* "true" when the operator issues the gRPC certificates from its self-managed CA. */}}
{{- define "homelab-autoscaler.grpcSelfManaged" -}}
{{- if and (eq .Values.tls.mode "selfManaged") (not .Values.tls.secrets.grpc) -}}true{{- end -}}
{{- end }}

{{/* The client certificate Secret cluster-autoscaler presents. */}}
{{- define "homelab-autoscaler.grpcClientSecret" -}}
{{- if eq .Values.tls.mode "certManager" -}}homelab-autoscaler-grpc-client-tls
{{- else if include "homelab-autoscaler.grpcSelfManaged" . -}}homelab-autoscaler-grpc-client
{{- else -}}{{ .Values.tls.secrets.grpcClient }}
{{- end -}}
{{- end }}

{{/* The issuer of the cert-manager Certificates. */}}
{{- define "homelab-autoscaler.issuerRef" -}}
{{- with .Values.tls.certManager.issuerRef }}
{{- toYaml . }}
{{- else -}}
kind: Issuer
name: homelab-autoscaler-ca
{{- end }}
{{- end }}
