{{/* Names, labels and addresses shared by every template. */}}

{{- define "tandem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's name prefix, at most 38 characters, so that every name made from it fits:
"<prefix>-router-replay" is a StatefulSet (52 at most: its pods' controller-revision-hash label
adds 11), "<that>-headless" a Service (63), "<prefix>-dashboard-router-replay" a ConfigMap. A
longer name is cut and given 5 characters of its hash, so two long releases stay apart.
Every name made from it must also be a DNS-1035 label (a Service's name: a letter first, then
letters, digits and "-"; no "."), which a release name need not be ("2.0-canary"): a release
that does not start with a letter comes after the chart's name ("tandem-2.0-canary"), dots
become "-", and a name so changed gets the 5 characters of the usual name's hash too
("tandem-2-0-canary-1a2b3"), so that it never meets another release's name ("a.b" and "a-b").
*/}}
{{- define "tandem.fullname" -}}
{{- $name := include "tandem.name" . }}
{{- $release := .Release.Name }}
{{- /* The usual name, "<release>-<chart>", or the release alone if it holds the chart's name. */}}
{{- $full := ternary $release (printf "%s-%s" $release $name) (contains $name $release) }}
{{- $valid := $full }}
{{- if .Values.fullnameOverride }}
{{- $full = .Values.fullnameOverride }}
{{- $valid = $full }}
{{- else if not (regexMatch "^[a-z]" $release) }}
{{- $valid = printf "%s-%s" $name $release }}
{{- end }}
{{- $valid = $valid | replace "." "-" }}
{{- if not (regexMatch "^[a-z]" $valid) }}
{{- $valid = printf "%s-%s" $name $valid }}
{{- end }}
{{- if and (eq $valid $full) (le (len $full) 38) }}
{{- $full | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" ($valid | trunc 32 | trimSuffix "-") ($full | sha256sum | trunc 5) }}
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

{{/* Bytes in a Kubernetes quantity such as "64Mi", "8Gi", "1G", "500m" or 1024, as a float. */}}
{{- define "tandem.bytes" -}}
{{- $quantity := toString . }}
{{- $unit := regexFind "[a-zA-Z]+$" $quantity }}
{{- $scales := dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 }}
{{- if not (hasKey $scales $unit) }}{{ fail (printf "quantity %q: unknown unit %q" $quantity $unit) }}{{ end }}
{{- mulf (float64 (trimSuffix $unit $quantity)) (get $scales $unit) }}
{{- end }}
