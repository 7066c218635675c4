{{/* Names, labels and addresses shared by every template. */}}

{{- define "tandem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's name prefix, at most 38 characters, so that every name made from it fits:
"<prefix>-router-replay" is a StatefulSet (52 at most: its pods' controller-revision-hash label
adds 11), "<that>-headless" a Service (63), "<prefix>-dashboard-router-replay" a ConfigMap. A
longer name is cut and given 5 characters of its hash, so two long releases stay apart.
*/}}
{{- define "tandem.fullname" -}}
{{- $full := "" }}
{{- if .Values.fullnameOverride }}
{{- $full = .Values.fullnameOverride }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- $full = ternary .Release.Name (printf "%s-%s" .Release.Name $name) (contains $name .Release.Name) }}
{{- end }}
{{- if le (len $full) 38 }}
{{- $full | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" ($full | trunc 32 | trimSuffix "-") ($full | sha256sum | trunc 5) }}
{{- end }}
{{- end }}

{{/*
The four services. key: the values key; name: the object-name suffix and component label;
binary: the executable in the image; port, metricsPort: gRPC and /metrics; service: the proto
service readiness is asked about; stateful: a StatefulSet with a data volume.
*/}}
{{- define "tandem.components" -}}
trainer: {key: trainer, name: trainer, binary: tandem-trainer, port: 50051, metricsPort: 9451, service: tandem.trainer.v1.JobService, stateful: true, dialsPeers: true, usesModel: true}
rollout: {key: rollout, name: rollout, binary: tandem-rollout, port: 50052, metricsPort: 9452, service: tandem.rollout.v1.RolloutService, stateful: false, dialsPeers: true, usesModel: true}
weightStore: {key: weightStore, name: weight-store, binary: tandem-weight-store, port: 50053, metricsPort: 9453, service: tandem.weightstore.v1.WeightStoreService, stateful: true, dialsPeers: false, usesModel: false}
routerReplay: {key: routerReplay, name: router-replay, binary: tandem-router-replay, port: 50054, metricsPort: 9454, service: tandem.routerreplay.v1.RouterReplayService, stateful: true, dialsPeers: false, usesModel: false}
{{- end }}

{{/* One component's description: (dict "root" $ "key" "trainer"). */}}
{{- define "tandem.component" -}}
{{- get (fromYaml (include "tandem.components" .root)) .key | toYaml }}
{{- end }}

{{- define "tandem.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tandem.labels" -}}
helm.sh/chart: {{ include "tandem.chart" . }}
{{ include "tandem.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "tandem.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tandem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of one component's objects: (dict "root" $ "name" "weight-store"). */}}
{{- define "tandem.componentLabels" -}}
{{ include "tandem.labels" .root }}
app.kubernetes.io/component: {{ .name }}
{{- end }}

{{- define "tandem.componentSelector" -}}
{{ include "tandem.selectorLabels" .root }}
app.kubernetes.io/component: {{ .name }}
{{- end }}

{{/* "<fullname>-<component>": (dict "root" $ "name" "weight-store"). */}}
{{- define "tandem.componentFullname" -}}
{{- printf "%s-%s" (include "tandem.fullname" .root) .name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The in-cluster "host:port" of a component's Service: (dict "root" $ "name" ... "port" N). */}}
{{- define "tandem.address" -}}
{{- printf "%s.%s.svc.%s:%v" (include "tandem.componentFullname" .) .root.Release.Namespace .root.Values.clusterDomain .port }}
{{- end }}

{{/* The headless Service listing every ready rollout replica, "name:port". */}}
{{- define "tandem.rolloutService" -}}
{{- printf "%s-headless.%s.svc.%s:50052" (include "tandem.componentFullname" (dict "root" . "name" "rollout")) .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{/* The name every service's certificate carries and peers verify. */}}
{{- define "tandem.tlsServerName" -}}
{{- printf "%s.%s.svc" (include "tandem.fullname" .) .Release.Namespace }}
{{- end }}

{{- define "tandem.authSecretName" -}}
{{- default (printf "%s-auth" (include "tandem.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{- define "tandem.tlsSecretName" -}}
{{- if .Values.tls.certManager.enabled }}
{{- printf "%s-tls" (include "tandem.fullname" .) }}
{{- else }}
{{- required "tls.existingSecret (or tls.certManager.enabled) is required when tls.enabled" .Values.tls.existingSecret }}
{{- end }}
{{- end }}

{{- define "tandem.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tandem.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tandem.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Seconds in a Go duration string such as "30s", "2m" or "1h" (whole units only). */}}
{{- define "tandem.seconds" -}}
{{- $unit := regexFind "[a-z]+$" . }}
{{- $count := int (trimSuffix $unit .) }}
{{- if eq $unit "s" }}{{ $count }}{{ else if eq $unit "m" }}{{ mul $count 60 }}{{ else if eq $unit "h" }}{{ mul $count 3600 }}{{ else }}{{ fail (printf "duration %q: use s, m or h" .) }}{{ end }}
{{- end }}
