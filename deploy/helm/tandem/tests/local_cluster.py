"""Runs a rendered chart on this machine the way a kubelet would, with loopback as the network.

Every Deployment and StatefulSet replica becomes a pod: its init containers run in order, then
its containers start as local processes with exactly the rendered command, args and env. What a
cluster would provide is emulated, and only that:
  - the pod network: each pod gets its own loopback address 127.S.0.N and its servers bind it
    (`--host=<pod IP>`, as binding 0.0.0.0 inside a pod's network namespace would);
  - cluster DNS: Service names resolve to the IPs of the pods they select, and a StatefulSet
    pod's name under its governing Service (<pod>.<serviceName>.<namespace>.svc...) to its own,
    through libnss_wrapper (gRPC is told to use the system resolver, GRPC_DNS_RESOLVER=native);
  - volumes: emptyDir, Secret and volumeClaimTemplate volumes are directories under the pod's
    directory, and paths under a mount in args and env are rewritten to that directory;
  - the image: its binaries are the ones the Dockerfile copies into /usr/local/bin;
  - what controllers and the kubelet add: a StatefulSet pod's labels
    statefulset.kubernetes.io/pod-name and apps.kubernetes.io/pod-index (Kubernetes 1.28+), env
    from fieldRefs (name, IP, namespace, labels), and $(VAR) in args expanded from the env;
  - UCX stays on loopback (UCX_NET_DEVICES=lo unless the render sets it).
Probes run as the kubelet runs them (gRPC health, exec), startup first, then readiness and
liveness every periodSeconds for as long as the pod lives; failures are recorded.
"""

import base64
import pathlib
import re
import signal
import subprocess
import threading
import time

import yaml

CLUSTER_DOMAIN = "cluster.local"
READY_TIMEOUT_SECONDS = 120


def load_manifests(path):
    return [doc for doc in yaml.safe_load_all(pathlib.Path(path).read_text()) if doc]


def image_binaries(dockerfile, build_root):
    """{name in the image's PATH: built binary}, from the Dockerfile's `cp bazel-bin/X /out/N`."""
    copies = re.findall(r"cp bazel-bin/(\S+) /out/(\S+)", pathlib.Path(dockerfile).read_text())
    if not copies:
        raise ValueError(f"{dockerfile} copies no binaries out of bazel-bin")
    return {name: pathlib.Path(build_root, path) for path, name in copies}


def selects(selector, labels):
    return all(labels.get(key) == value for key, value in selector.items())


class Container:
    """One container of a pod: its process, its mounts, its probes."""

    def __init__(self, pod, spec):
        self.pod = pod
        self.spec = spec
        self.name = spec["name"]
        self.process = None
        mounts = [(m["mountPath"], pod.volumes[m["name"]]) for m in spec.get("volumeMounts", [])]
        self._mounts = sorted(mounts, key=lambda mount: -len(mount[0]))

    def host_path(self, path):
        """Where a path inside this container lives on this machine."""
        for mount_path, directory in self._mounts:
            if path == mount_path or path.startswith(mount_path + "/"):
                return str(directory) + path[len(mount_path):]
        return path

    def _mapped(self, word):
        flag, equals, value = word.partition("=")
        if equals and flag.startswith("-"):
            return f"{flag}={self.host_path(value)}"
        return self.host_path(word)

    def argv(self):
        env = self.environment()
        # As the kubelet does: $(VAR) names a container env variable; unknown ones stay as is.
        expand = lambda word: re.sub(r"\$\((\w+)\)",
                                     lambda match: env.get(match.group(1), match.group(0)), word)
        words = [self._mapped(expand(word))
                 for word in self.spec["command"] + self.spec.get("args", [])]
        if self.spec.get("ports"):
            words.append(f"--host={self.pod.ip}")
        return words

    def environment(self):
        cluster = self.pod.cluster
        env = dict(cluster.base_env)
        for variable in self.spec.get("env", []):
            env[variable["name"]] = self._mapped(cluster.env_value(self.pod, variable))
        env.setdefault("UCX_NET_DEVICES", "lo")
        return env

    def start(self):
        with open(self.pod.directory / f"{self.name}.log", "ab") as log:  # Popen keeps a copy.
            self.process = subprocess.Popen(self.argv(), env=self.environment(), stdout=log,
                                            stderr=subprocess.STDOUT, cwd=self.pod.directory)

    def run_to_completion(self, timeout):
        self.start()
        if self.process.wait(timeout=timeout) != 0:
            raise RuntimeError(f"init container {self.pod.name}/{self.name} exited "
                               f"{self.process.returncode}:\n{self.log_tail()}")

    def log_tail(self, lines=30):
        path = self.pod.directory / f"{self.name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def probe(self, probe):
        """Runs one probe; True when it passes."""
        timeout = probe.get("timeoutSeconds", 1)
        if "grpc" in probe:
            command = [str(self.pod.cluster.binaries["tandem-health-check"]),
                       f"--target={self.pod.ip}:{probe['grpc']['port']}",
                       f"--service={probe['grpc'].get('service', '')}", f"--wait={timeout}s"]
        elif "exec" in probe:
            command = [self._mapped(word) for word in probe["exec"]["command"]]
        else:
            raise NotImplementedError(f"{self.pod.name}/{self.name}: probe {sorted(probe)}")
        try:
            return subprocess.run(command, env=self.environment(), capture_output=True,
                                  timeout=timeout + 5).returncode == 0
        except subprocess.TimeoutExpired:
            return False


class Pod:
    def __init__(self, cluster, name, ip, workload):
        self.cluster = cluster
        self.name = name
        self.ip = ip
        template = workload["spec"]["template"]
        self.labels = dict(template["metadata"]["labels"])
        if workload["kind"] == "StatefulSet":
            self.labels["statefulset.kubernetes.io/pod-name"] = name
            self.labels["apps.kubernetes.io/pod-index"] = name.rsplit("-", 1)[1]
        self.spec = template["spec"]
        self.directory = cluster.directory / name
        self.volumes = {}
        for volume in self.spec.get("volumes", []) + [
                {"name": claim["metadata"]["name"], "persistentVolumeClaim": {}}
                for claim in workload["spec"].get("volumeClaimTemplates", [])]:
            self.volumes[volume["name"]] = self._make_volume(volume)
        self.init_containers = [Container(self, spec)
                                for spec in self.spec.get("initContainers", [])]
        self.containers = [Container(self, spec) for spec in self.spec["containers"]]
        self.probe_failures = []
        self.stopped = threading.Event()

    def _make_volume(self, volume):
        directory = self.directory / "volumes" / volume["name"]
        directory.mkdir(parents=True, exist_ok=True)
        if "secret" in volume:
            mode = volume["secret"].get("defaultMode", 0o644)
            for key, value in self.cluster.secret(volume["secret"]["secretName"]).items():
                path = directory / key
                path.write_bytes(value)
                path.chmod(mode)
        elif not {"emptyDir", "persistentVolumeClaim"} & volume.keys():
            raise NotImplementedError(
                f"{self.name}: volume {volume['name']} of kind {sorted(volume)}")
        return directory

    def start(self):
        """Init containers in order, then the containers; returns once every one is ready."""
        for container in self.init_containers:
            container.run_to_completion(timeout=READY_TIMEOUT_SECONDS)
        for container in self.containers:
            container.start()
        for container in self.containers:
            self._wait_until_started_and_ready(container)
            threading.Thread(target=self._probe_periodically, args=(container,),
                             daemon=True).start()

    def _wait_until_started_and_ready(self, container):
        for kind in ("startupProbe", "readinessProbe"):
            probe = container.spec.get(kind)
            if probe is None:
                continue
            budget = (probe.get("initialDelaySeconds", 0) +
                      probe.get("failureThreshold", 3) * probe.get("periodSeconds", 10))
            if kind == "readinessProbe":
                budget = READY_TIMEOUT_SECONDS  # Readiness failing only keeps a pod unready.
            deadline = time.monotonic() + budget
            while not container.probe(probe):
                if container.process.poll() is not None or time.monotonic() > deadline:
                    exit_code = container.process.poll()
                    raise RuntimeError(f"{self.name}/{container.name}: {kind} never passed "
                                       f"(exit {exit_code}):\n{container.log_tail()}")
                time.sleep(0.25)

    def _probe_periodically(self, container):
        probes = [(kind, container.spec[kind]) for kind in ("readinessProbe", "livenessProbe")
                  if kind in container.spec]
        next_run = {kind: time.monotonic() + probe.get("periodSeconds", 10)
                    for kind, probe in probes}
        while not self.stopped.wait(0.25):
            for kind, probe in probes:
                if time.monotonic() < next_run[kind]:
                    continue
                next_run[kind] += probe.get("periodSeconds", 10)
                if not container.probe(probe) and not self.stopped.is_set():
                    self.probe_failures.append(f"{self.name}/{container.name} {kind}")

    def kill(self):
        """SIGKILL, as when a node dies."""
        self.stopped.set()
        for container in self.containers:
            container.process.kill()
            container.process.wait()

    def terminate(self):
        """SIGTERM, then SIGKILL after terminationGracePeriodSeconds; returns the exit codes."""
        self.stopped.set()
        grace = self.spec.get("terminationGracePeriodSeconds", 30)
        running = [c for c in self.containers if c.process and c.process.poll() is None]
        for container in running:
            container.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        codes = {}
        for container in running:
            try:
                codes[container.name] = container.process.wait(
                    timeout=max(0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                container.process.kill()
                codes[container.name] = f"killed after the {grace} s grace period"
        return codes


class LocalCluster:
    def __init__(self, manifests, binaries, directory, subnet):
        self.objects = manifests
        self.binaries = binaries
        self.directory = pathlib.Path(directory)
        self.subnet = subnet  # Pods get 127.<subnet>.0.<10+i>.
        self.pods = []
        self.pod_domains = {}  # A StatefulSet pod's name: its governing Service's domain.
        for workload in self.of_kind("StatefulSet", "Deployment"):
            for ordinal in range(workload["spec"].get("replicas", 1)):
                name = f"{workload['metadata']['name']}-{ordinal}"
                ip = f"127.{subnet}.0.{10 + len(self.pods)}"
                self.pods.append(Pod(self, name, ip, workload))
                if workload["kind"] == "StatefulSet":
                    self.pod_domains[name] = (f"{workload['spec']['serviceName']}."
                                              f"{self.namespace(workload)}.svc.{CLUSTER_DOMAIN}")
        hosts = self.directory / "hosts"
        hosts.write_text("".join(f"{ip} {name}\n" for name, ip in self.service_addresses()))
        self.base_env = {"PATH": str(self._image_path()), "LD_PRELOAD": "libnss_wrapper.so",
                         "NSS_WRAPPER_HOSTS": str(hosts), "GRPC_DNS_RESOLVER": "native"}

    def _image_path(self):
        """A directory holding the image's binaries under their image names."""
        path = self.directory / "image-bin"
        path.mkdir(exist_ok=True)
        for name, binary in self.binaries.items():
            (path / name).symlink_to(binary.resolve())
        return path

    def of_kind(self, *kinds):
        return [obj for obj in self.objects if obj["kind"] in kinds]

    def namespace(self, obj):
        return obj["metadata"].get("namespace", "default")

    def secret(self, name):
        (secret,) = [s for s in self.of_kind("Secret") if s["metadata"]["name"] == name]
        return {key: base64.b64decode(value) for key, value in secret.get("data", {}).items()}

    def env_value(self, pod, variable):
        if "value" in variable:
            return variable["value"]
        source = variable["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            return self.secret(ref["name"])[ref["key"]].decode()
        fields = {"status.podIP": pod.ip, "metadata.name": pod.name,
                  "metadata.namespace": "default"}
        fields.update({f"metadata.labels['{key}']": value for key, value in pod.labels.items()})
        return fields[source["fieldRef"]["fieldPath"]]

    def pods_of(self, service):
        return [pod for pod in self.pods if selects(service["spec"]["selector"], pod.labels)]

    def service_addresses(self):
        """(DNS name, pod IP) for every Service and every pod it selects, and for every
        StatefulSet pod under its governing Service."""
        for service in self.of_kind("Service"):
            name = f"{service['metadata']['name']}.{self.namespace(service)}.svc.{CLUSTER_DOMAIN}"
            for pod in self.pods_of(service):
                yield name, pod.ip
        for pod in self.pods:
            if pod.name in self.pod_domains:
                yield f"{pod.name}.{self.pod_domains[pod.name]}", pod.ip

    def pod(self, name):
        (pod,) = [pod for pod in self.pods if pod.name == name]
        return pod

    def start(self):
        """Starts every pod at once, as a scheduler would, and waits until all are ready."""
        errors = []

        def start(pod):
            try:
                pod.start()
            except Exception as error:  # Reported below, with every other pod's.
                errors.append(f"{pod.name}: {error}")

        threads = [threading.Thread(target=start, args=(pod,)) for pod in self.pods]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise RuntimeError("pods did not become ready:\n" + "\n".join(errors))

    def stop(self):
        return {pod.name: pod.terminate() for pod in self.pods}

    def probe_failures(self):
        return [failure for pod in self.pods for failure in pod.probe_failures]

    def container_port(self, service, port_name):
        """The pod port a Service port named `port_name` targets."""
        (port,) = [p for p in service["spec"]["ports"] if p["name"] == port_name]
        target = port.get("targetPort", port["port"])
        if isinstance(target, int):
            return target
        for pod in self.pods_of(service):
            for container in pod.spec["containers"]:
                for container_port in container.get("ports", []):
                    if container_port["name"] == target:
                        return container_port["containerPort"]
        raise ValueError(f"Service {service['metadata']['name']}: no pod port named {target}")

    def scrape_configs(self, scrape_interval):
        """Prometheus scrape jobs equivalent to the ServiceMonitors (labelled as the operator
        labels them), with static targets in place of Kubernetes service discovery."""
        configs = []
        for monitor in self.of_kind("ServiceMonitor"):
            spec = monitor["spec"]
            namespaces = spec.get("namespaceSelector", {}).get("matchNames",
                                                             [self.namespace(monitor)])
            services = [s for s in self.of_kind("Service")
                        if self.namespace(s) in namespaces and
                        selects(spec["selector"]["matchLabels"], s["metadata"].get("labels", {}))]
            for index, endpoint in enumerate(spec["endpoints"]):
                for service in services:
                    labels = service["metadata"]["labels"]
                    port = self.container_port(service, endpoint["port"])
                    configs.append({
                        "job_name": f"serviceMonitor/{monitor['metadata']['name']}/{index}/"
                                    f"{service['metadata']['name']}",
                        "scrape_interval": scrape_interval,
                        "metrics_path": endpoint.get("path", "/metrics"),
                        "scheme": endpoint.get("scheme", "http"),
                        "static_configs": [{
                            "targets": [f"{pod.ip}:{port}"],
                            "labels": {"job": labels.get(spec.get("jobLabel"),
                                                         service["metadata"]["name"]),
                                       "namespace": self.namespace(service),
                                       "service": service["metadata"]["name"],
                                       "endpoint": endpoint["port"], "pod": pod.name},
                        } for pod in self.pods_of(service)],
                    })
        return configs

    def rule_groups(self):
        return [group for rule in self.of_kind("PrometheusRule")
                for group in rule["spec"]["groups"]]
