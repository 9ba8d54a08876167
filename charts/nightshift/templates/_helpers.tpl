{{/* The release's full name: the release name when it already contains the chart name, else both. */}}
{{- define "nightshift.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "nightshift.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nightshift.labels" -}}
{{ include "nightshift.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Labels of the monitoring.coreos.com objects: the common ones plus monitoring.labels (selector match). */}}
{{- define "nightshift.monitoringLabels" -}}
{{ include "nightshift.labels" . }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "nightshift.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "nightshift.fullname" .) -}}
{{- end -}}

{{- define "nightshift.postgres" -}}
{{- if .Values.store.postgresUrlSecret.name }}true{{ end -}}
{{- end -}}

{{/* Where each entry of .Values.secrets goes in the settings (section.key). */}}
{{- define "nightshift.secretSettings" -}}
webhookToken: webhook.token_file
webhookBasicPassword: webhook.basic_password_file
operatorToken: operator_token_file
prometheusBearerToken: prometheus.bearer_token_file
grafanaToken: grafana.token_file
notifyWebhookUrl: notify.webhook_url_file
smtpPassword: notify.smtp_password_file
slurmSshKey: slurm.key_file
slurmKnownHosts: slurm.known_hosts_file
{{- end -}}

{{/* The distinct Secret names referenced under .Values.secrets, sorted: one volume each. */}}
{{- define "nightshift.secretNames" -}}
{{- $names := list -}}
{{- range $purpose, $ref := .Values.secrets -}}
{{- if $ref.name }}{{ $names = append $names $ref.name }}{{ end -}}
{{- end -}}
{{- toJson (dict "names" ($names | uniq | sortAlpha)) -}}
{{- end -}}

{{- define "nightshift.playbookDir" -}}
{{- if or .Values.playbooks .Values.existingPlaybooksConfigMap -}}
/etc/nightshift/playbooks
{{- else -}}
/usr/share/nightshift/playbooks
{{- end -}}
{{- end -}}

{{/* Refusals at template time: each says what to set. */}}
{{- define "nightshift.validate" -}}
{{- if and (gt (int .Values.replicas) 1) (not (include "nightshift.postgres" .)) -}}
{{- fail (printf "replicas: %d needs PostgreSQL: set store.postgresUrlSecret.name to a Secret holding the URL (SQLite lives on one pod's volume; several replicas would each keep their own store and act twice)" (int .Values.replicas)) -}}
{{- end -}}
{{- $webhook := .Values.settings.webhook | default dict -}}
{{- if not (or .Values.secrets.webhookToken.name $webhook.auth_disabled (and $webhook.basic_user .Values.secrets.webhookBasicPassword.name)) -}}
{{- fail "secrets.webhookToken.name: the webhook needs a Secret holding its bearer token (or settings.webhook.basic_user with secrets.webhookBasicPassword, or settings.webhook.auth_disabled: true)" -}}
{{- end -}}
{{- range $purpose, $ref := .Values.secrets -}}
{{- if not (hasKey (fromYaml (include "nightshift.secretSettings" $)) $purpose) -}}
{{- fail (printf "secrets.%s: unknown secret (known: %s)" $purpose (keys (fromYaml (include "nightshift.secretSettings" $)) | sortAlpha | join ", ")) -}}
{{- end -}}
{{- if and $ref.name (not $ref.key) -}}
{{- fail (printf "secrets.%s.key: required when secrets.%s.name is set" $purpose $purpose) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.playbooks .Values.existingPlaybooksConfigMap -}}
{{- fail "playbooks and existingPlaybooksConfigMap: set one, not both" -}}
{{- end -}}
{{- end -}}

{{/* config.yaml: .Values.settings with the paths the chart owns set over it. */}}
{{- define "nightshift.settings" -}}
{{- $s := deepCopy (.Values.settings | default dict) -}}
{{- if not $s.external_url -}}
{{- $_ := set $s "external_url" (printf "http://%s.%s.svc:%v" (include "nightshift.fullname" .) .Release.Namespace .Values.service.port) -}}
{{- end -}}
{{- $_ := set $s "data_dir" "/var/lib/nightshift" -}}
{{- /* Node validation pods run where the chart's Role lets them be created. */ -}}
{{- $repair := get $s "repair" | default dict -}}
{{- $_ := set $repair "validation_namespace" (include "nightshift.validationNamespace" .) -}}
{{- $_ := set $s "repair" $repair -}}
{{- $_ := set $s "playbook_paths" (list (include "nightshift.playbookDir" .)) -}}
{{- $_ := set $s "permissions_file" (ternary "/etc/nightshift/config/permissions.yaml" nil (not (empty .Values.permissions))) -}}
{{- $targets := fromYaml (include "nightshift.secretSettings" .) -}}
{{- range $purpose, $ref := .Values.secrets -}}
{{- if $ref.name -}}
{{- $path := printf "/var/run/secrets/nightshift/%s/%s" $ref.name $ref.key -}}
{{- $where := splitList "." (get $targets $purpose) -}}
{{- if eq (len $where) 1 -}}
{{- $_ := set $s (first $where) $path -}}
{{- else -}}
{{- $section := get $s (first $where) | default dict -}}
{{- $_ := set $section (last $where) $path -}}
{{- $_ := set $s (first $where) $section -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $s -}}
{{- end -}}

{{/* Where node validation pods run (settings repair.validation_namespace) and the chart's Role lets them be
created: rbac.validationNamespace, else the release namespace. */}}
{{- define "nightshift.validationNamespace" -}}
{{- .Values.rbac.validationNamespace | default .Release.Namespace -}}
{{- end -}}

{{/* The rules of one group of files/rbac.yaml, each with its reason as a comment. */}}
{{- define "nightshift.rbacRules" -}}
{{- range .rules }}
# {{ .why }}
- apiGroups: {{ toJson .apiGroups }}
  resources: {{ toJson .resources }}
  verbs: {{ toJson .verbs }}
{{- end }}
{{- end -}}
