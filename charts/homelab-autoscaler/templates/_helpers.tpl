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

{{/* The cluster-autoscaler Deployment the operator restarts on a new client certificate ("" for
none): the chart's own, or one installed otherwise (clusterAutoscaler.external). */}}
{{- define "homelab-autoscaler.caDeployment" -}}
{{- if and .Values.clusterAutoscaler.enabled .Values.clusterAutoscaler.external.deployment -}}
{{- fail "clusterAutoscaler.enabled and clusterAutoscaler.external.deployment both name a cluster-autoscaler: set one" -}}
{{- end -}}
{{- if .Values.clusterAutoscaler.enabled -}}homelab-autoscaler-cluster-autoscaler
{{- else if .Values.clusterAutoscaler.external.deployment -}}
{{- if not (and .Values.grpc.enabled (include "homelab-autoscaler.grpcClientSecret" .)) -}}
{{- fail "clusterAutoscaler.external needs the gRPC provider with mutual TLS: grpc.enabled, and tls.mode=certManager or selfManaged, or tls.secrets.grpc and tls.secrets.grpcClient" -}}
{{- end -}}
{{- .Values.clusterAutoscaler.external.deployment -}}
{{- end -}}
{{- end }}

{{/* The namespace cluster-autoscaler runs in. */}}
{{- define "homelab-autoscaler.caNamespace" -}}
{{- if .Values.clusterAutoscaler.enabled -}}{{ .Release.Namespace }}
{{- else -}}{{ .Values.clusterAutoscaler.external.namespace | default .Release.Namespace }}
{{- end -}}
{{- end }}

{{/* The client certificate Secret cluster-autoscaler's pods mount, in its namespace. */}}
{{- define "homelab-autoscaler.caClientSecret" -}}
{{- if .Values.clusterAutoscaler.enabled -}}{{ include "homelab-autoscaler.grpcClientSecret" . }}
{{- else -}}{{ .Values.clusterAutoscaler.external.clientSecret | default (include "homelab-autoscaler.grpcClientSecret" .) }}
{{- end -}}
{{- end }}

{{/* "true" when the operator keeps a copy of the client Secret for cluster-autoscaler. */}}
{{- define "homelab-autoscaler.caClientCopy" -}}
{{- if and (include "homelab-autoscaler.caDeployment" .) (or (ne (include "homelab-autoscaler.caNamespace" .) .Release.Namespace) (ne (include "homelab-autoscaler.caClientSecret" .) (include "homelab-autoscaler.grpcClientSecret" .))) -}}true{{- end -}}
{{- end }}
