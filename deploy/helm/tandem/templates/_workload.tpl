{{/*
One service's objects: its workload (StatefulSet with a data volume, or a Deployment), a
ClusterIP Service, a headless Service (the StatefulSet's governing Service; rollout's lists
every ready replica for the trainer) and a PodDisruptionBudget.
Called as (dict "root" $ "key" "trainer" "args" (list ...) ["env" (list ...)] ["ordered" true]):
`args` are the service's own flags, `env` its own environment variables; `ordered` runs a
service without data as a StatefulSet too, for pods with stable names and indices (rollout's
relay chain).
*/}}
{{- define "tandem.workload" -}}
{{- $root := .root }}
{{- $c := fromYaml (include "tandem.component" (dict "root" $root "key" .key)) }}
{{- $v := get $root.Values .key }}
{{- $names := dict "root" $root "name" $c.name }}
{{- $fullname := include "tandem.componentFullname" $names }}
{{- $ucx := merge (deepCopy ($v.ucx | default dict)) $root.Values.ucx }}
{{- $rdma := and $v.rdma.resource (gt (int $v.rdma.count) 0) }}
{{- $tlsDir := "/var/run/tandem/tls" }}
{{- $statefulSet := or $c.stateful .ordered }}
{{- /* /dev/shm is an emptyDir in memory: what it holds counts against the container's memory
limit, so a size at or over the limit lets the kernel kill the container for its own shm. */}}
{{- $memoryLimit := (($v.resources | default dict).limits | default dict).memory }}
{{- if and $memoryLimit (ge (float64 (include "tandem.bytes" $v.shmSize)) (float64 (include "tandem.bytes" $memoryLimit))) }}
{{- fail (printf "%s.shmSize (%v) must be less than %s.resources.limits.memory (%v): /dev/shm is memory the container's limit counts" .key $v.shmSize .key $memoryLimit) }}
{{- end }}
apiVersion: apps/v1
kind: {{ ternary "StatefulSet" "Deployment" $statefulSet }}
metadata:
  name: {{ $fullname }}
  labels:
    {{- include "tandem.componentLabels" $names | nindent 4 }}
spec:
  {{- if $c.stateful }}
  # One writer per volume: the stores are single-replica by design; the trainer's ranks each
  # have their own volume (rank 0's holds the job records and checkpoints).
  replicas: {{ $v.ranks | default 1 }}
  serviceName: {{ $fullname }}-headless
  podManagementPolicy: Parallel
  updateStrategy:
    {{- toYaml $v.updateStrategy | nindent 4 }}
  {{- else if $statefulSet }}
  replicas: {{ $v.replicas }}
  serviceName: {{ $fullname }}-headless
  podManagementPolicy: Parallel
  # One pod at a time, from the highest index down: the rest of the chain keeps serving.
  updateStrategy: {type: RollingUpdate}
  {{- else }}
  replicas: {{ $v.replicas }}
  strategy:
    {{- toYaml $v.updateStrategy | nindent 4 }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "tandem.componentSelector" $names | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "tandem.componentSelector" $names | nindent 8 }}
        {{- with $v.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- /* No checksum of the token or certificate: the services read renewed files
      without a restart (docs/operations.md, Auth), and a checksum of a token that `helm
      template` generates anew on every render (Argo CD) would restart every pod on every
      sync. */}}
      {{- if or $root.Values.metrics.scrapeAnnotations $v.podAnnotations }}
      annotations:
        {{- if $root.Values.metrics.scrapeAnnotations }}
        prometheus.io/scrape: "true"
        prometheus.io/port: {{ $c.metricsPort | quote }}
        prometheus.io/path: /metrics
        {{- end }}
        {{- with $v.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "tandem.serviceAccountName" $root }}
      automountServiceAccountToken: {{ $root.Values.serviceAccount.automountServiceAccountToken }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      terminationGracePeriodSeconds: {{ add (include "tandem.seconds" $root.Values.drain.delay) (include "tandem.seconds" $root.Values.drain.timeout) 15 }}
      {{- if $v.hostNetwork }}
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      {{- end }}
      {{- if $v.hostIPC }}
      hostIPC: true
      {{- end }}
      {{- with $v.runtimeClassName }}
      runtimeClassName: {{ . }}
      {{- end }}
      {{- if and $c.usesModel $root.Values.model.generate.enabled }}
      initContainers:
        - name: make-base-model
          image: {{ include "tandem.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: [tandem-make-base-model]
          args:
            - --task={{ $root.Values.model.generate.task }}
            - --digits={{ $root.Values.model.generate.digits }}
            - --max_steps={{ $root.Values.model.generate.maxSteps }}
            - --seed={{ $root.Values.model.generate.seed }}
            - --out=/models/{{ $root.Values.model.file }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          resources:
            {{- toYaml $v.resources | nindent 12 }}
          volumeMounts:
            - {name: model, mountPath: /models}
            - {name: tmp, mountPath: /tmp}
      {{- end }}
      containers:
        - name: {{ $c.name }}
          image: {{ include "tandem.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: [{{ $c.binary }}]
          args:
            - --port={{ $c.port }}
            - --metrics_port={{ $c.metricsPort }}
            - --auth_token_file=/var/run/tandem/auth/token
            - --drain_delay={{ $root.Values.drain.delay }}
            - --drain_timeout={{ $root.Values.drain.timeout }}
            - --log_level={{ $root.Values.logLevel }}
            {{- if $root.Values.tls.enabled }}
            - --tls_cert={{ $tlsDir }}/tls.crt
            - --tls_key={{ $tlsDir }}/tls.key
            {{- if $root.Values.tls.mutual }}
            - --tls_client_ca={{ $tlsDir }}/ca.crt
            {{- end }}
            {{- if $c.dialsPeers }}
            {{- include "tandem.peerTlsArgs" $root | nindent 12 }}
            {{- end }}
            {{- end }}
            {{- range .args }}
            - {{ . }}
            {{- end }}
            {{- range $v.extraArgs }}
            - {{ . }}
            {{- end }}
          env:
            {{- with .env }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
            - {name: UCX_TLS, value: {{ $ucx.transports | quote }}}
            {{- with $ucx.netDevices }}
            - {name: UCX_NET_DEVICES, value: {{ . | quote }}}
            {{- end }}
            {{- range $name, $value := $ucx.env }}
            - {name: {{ $name }}, value: {{ $value | quote }}}
            {{- end }}
            {{- with $v.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - {name: grpc, containerPort: {{ $c.port }}, protocol: TCP}
            - {name: metrics, containerPort: {{ $c.metricsPort }}, protocol: TCP}
          # Ready: SERVING (model loaded, not draining). Live: the server answers at all.
          readinessProbe:
            {{- include "tandem.probeHandler" (dict "root" $root "port" $c.port "service" "") | trim | nindent 12 }}
            periodSeconds: 5
            timeoutSeconds: 5
          livenessProbe:
            {{- include "tandem.probeHandler" (dict "root" $root "port" $c.port "service" "liveness") | trim | nindent 12 }}
            periodSeconds: 20
            timeoutSeconds: 5
            failureThreshold: 3
          # Rollout loads the model, the stores open their data, the trainer its jobs, before
          # serving: liveness waits until the container was ready once.
          startupProbe:
            {{- include "tandem.probeHandler" (dict "root" $root "port" $c.port "service" "") | trim | nindent 12 }}
            periodSeconds: 5
            timeoutSeconds: 5
            failureThreshold: {{ div $v.startupTimeoutSeconds 5 }}
          resources:
            {{- $resources := deepCopy $v.resources }}
            {{- $requests := $resources.requests | default dict }}
            {{- $limits := $resources.limits | default dict }}
            {{- if gt (int $v.gpu.count) 0 }}
            {{- $_ := set $requests $v.gpu.resource $v.gpu.count }}
            {{- $_ := set $limits $v.gpu.resource $v.gpu.count }}
            {{- end }}
            {{- if $rdma }}
            {{- $_ := set $requests $v.rdma.resource $v.rdma.count }}
            {{- $_ := set $limits $v.rdma.resource $v.rdma.count }}
            {{- end }}
            {{- toYaml (dict "requests" $requests "limits" $limits) | nindent 12 }}
          securityContext:
            {{- $security := deepCopy $root.Values.securityContext }}
            {{- if $rdma }}
            {{- /* Registering memory with an RDMA NIC pins it. */}}
            {{- $_ := set $security "capabilities" (dict "drop" (list "ALL") "add" (list "IPC_LOCK")) }}
            {{- end }}
            {{- toYaml $security | nindent 12 }}
          volumeMounts:
            - {name: auth, mountPath: /var/run/tandem/auth, readOnly: true}
            - {name: tmp, mountPath: /tmp}
            - {name: dshm, mountPath: /dev/shm}
            {{- if $c.stateful }}
            - {name: data, mountPath: /var/lib/tandem}
            {{- end }}
            {{- if $c.usesModel }}
            - {name: model, mountPath: /models, readOnly: {{ not $root.Values.model.generate.enabled }}}
            {{- end }}
            {{- if $root.Values.tls.enabled }}
            - {name: tls, mountPath: {{ $tlsDir }}, readOnly: true}
            {{- end }}
            {{- with $v.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - name: auth
          secret: {secretName: {{ include "tandem.authSecretName" $root }}, defaultMode: 0440}
        - name: tmp
          emptyDir: {}
        - name: dshm
          emptyDir: {medium: Memory, sizeLimit: {{ $v.shmSize }}}
        {{- if $c.usesModel }}
        - name: model
          {{- if $root.Values.model.generate.enabled }}
          emptyDir: {}
          {{- else }}
          persistentVolumeClaim:
            claimName: {{ required "model.existingClaim is required unless model.generate.enabled" $root.Values.model.existingClaim }}
            readOnly: true
          {{- end }}
        {{- end }}
        {{- if $root.Values.tls.enabled }}
        - name: tls
          secret: {secretName: {{ include "tandem.tlsSecretName" $root }}, defaultMode: 0440}
        {{- end }}
        {{- with $v.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $v.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml . | nindent 8 }}
      {{- end }}
  {{- if $c.stateful }}
  volumeClaimTemplates:
    - metadata:
        name: data
        labels:
          {{- include "tandem.componentSelector" $names | nindent 10 }}
      spec:
        accessModes:
          {{- toYaml $v.persistence.accessModes | nindent 10 }}
        {{- with $v.persistence.storageClass }}
        storageClassName: {{ . }}
        {{- end }}
        resources:
          requests:
            storage: {{ $v.persistence.size }}
  {{- end }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $fullname }}
  labels:
    {{- include "tandem.componentLabels" $names | nindent 4 }}
spec:
  type: ClusterIP
  selector:
    {{- include "tandem.componentSelector" $names | nindent 4 }}
    {{- if $c.stateful }}
    # The single writer, or the trainer's rank 0 (the Job API).
    statefulset.kubernetes.io/pod-name: {{ $fullname }}-0
    {{- end }}
  ports:
    - {name: grpc, port: {{ $c.port }}, targetPort: grpc, protocol: TCP, appProtocol: grpc}
    - {name: metrics, port: {{ $c.metricsPort }}, targetPort: metrics, protocol: TCP}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $fullname }}-headless
  labels:
    {{- include "tandem.componentLabels" $names | nindent 4 }}
    # ServiceMonitors select this Service, which lists every pod (the other selects only the
    # trainer's rank 0 and a store's writer); its value names the Prometheus job.
    tandem.dev/scrape-job: tandem-{{ $c.name }}
spec:
  clusterIP: None
  # Only ready pods: a replica that loads or drains gets no new job.
  publishNotReadyAddresses: false
  selector:
    {{- include "tandem.componentSelector" $names | nindent 4 }}
  ports:
    - {name: grpc, port: {{ $c.port }}, targetPort: grpc, protocol: TCP, appProtocol: grpc}
    - {name: metrics, port: {{ $c.metricsPort }}, targetPort: metrics, protocol: TCP}
{{- /* A budget protects something only where one pod may go while others serve. */}}
{{- if and $v.podDisruptionBudget.enabled (gt (int (ternary ($v.ranks | default 1) $v.replicas $c.stateful)) 1) }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $fullname }}
  labels:
    {{- include "tandem.componentLabels" $names | nindent 4 }}
spec:
  maxUnavailable: {{ $v.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "tandem.componentSelector" $names | nindent 6 }}
{{- end }}
{{- end }}

{{/*
A probe's handler: the kubelet's own gRPC health check, or, with TLS (which the kubelet's probe
does not speak), the image's health check over TLS. (dict "root" $ "port" N "service" NAME)
*/}}
{{- define "tandem.probeHandler" -}}
{{- if .root.Values.tls.enabled }}
exec:
  command:
    - tandem-health-check
    - --target=127.0.0.1:{{ .port }}
    - --service={{ .service }}
    - --wait=4s
    {{- include "tandem.peerTlsArgs" .root | nindent 4 }}
{{- else }}
grpc: {port: {{ .port }}, service: {{ .service | quote }}}
{{- end }}
{{- end }}

{{/* Flags of a service that dials the others over TLS. */}}
{{- define "tandem.peerTlsArgs" -}}
- --peer_tls_ca=/var/run/tandem/tls/ca.crt
- --peer_tls_server_name={{ include "tandem.tlsServerName" . }}
{{- if .Values.tls.mutual }}
- --peer_tls_cert=/var/run/tandem/tls/tls.crt
- --peer_tls_key=/var/run/tandem/tls/tls.key
{{- end }}
{{- end }}
