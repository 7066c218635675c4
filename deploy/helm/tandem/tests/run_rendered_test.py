#!/usr/bin/env python3
"""Runs what the chart renders for a CPU values file and checks it works as deployed.

    run_rendered_test.py --case=cpu            # job, probes, Prometheus, dashboards, alert
    run_rendered_test.py --case=cpu-replicas3  # job prompts reach all three rollout replicas
    run_rendered_test.py --case=cpu-ranks2     # a job trains data-parallel on both trainer pods
    run_rendered_test.py --case=cpu-relay3     # replicas 1 and 2 read adapters from the one before

The render is the committed golden file of the case (golden_test keeps it equal to what the
chart renders). local_cluster.py starts it as a kubelet would, on loopback; a job is submitted
with tandem-cli through the trainer's Service name, as a user would (a spec names no
addresses). For `cpu`, a real Prometheus scrapes what the ServiceMonitors select (every second rather
than every 15 s, to keep the test short) and evaluates the PrometheusRule's rules; every
dashboard query and recording rule must return a series, the job's adapter must export through
the trainer's and the weight-store's Service names (the NOTES' step 4), and killing a service
must put its TandemServiceDown alert in pending.
"""

import argparse
import json
import os
import pathlib
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import yaml

# Under Bazel the test runs from a copy outside its runfiles, where its library lives.
RUNFILES = (pathlib.Path(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"])
            if "TEST_SRCDIR" in os.environ else pathlib.Path(__file__).resolve().parents[4])
# Run by hand from the repository, the binaries are the ones bazel-bin holds.
BUILD_ROOT = RUNFILES if "TEST_SRCDIR" in os.environ else RUNFILES / "bazel-bin"
sys.path.insert(0, str(RUNFILES / "deploy/helm/tandem/tests"))
import local_cluster  # noqa: E402

RELEASE = "tandem"
NAMESPACE = "default"
JOB_TIMEOUT_SECONDS = 300
# What Grafana substitutes for the dashboards' variables: every job, and a rate window that
# holds many samples at the test's 1 s scrape interval.
DASHBOARD_VARIABLES = {"$__rate_interval": "30s", "$job_id": ".+", "$namespace": NAMESPACE}

SHORT_JOB = {
    "display_name": "chart-on-loopback",
    "task": {"name": "addition", "params": {"digits": "1"}},
    "lora": {"rank": 4, "alpha": 8},
    "algorithm": "ALGORITHM_GRPO",
    "algorithm_config": {"learning_rate": 0.005, "max_grad_norm": 1.0},
    "routing_replay": "ROUTING_REPLAY_MODE_R3",
    "is_correction": {"mode": "IS_CORRECTION_MODE_TOKEN_TIS"},
    "prompts_per_step": 24,
    "group_size": 4,
    "num_steps": 4,
    "micro_batch_size": 48,
    "sampling": {"temperature": 0.6, "max_new_tokens": 4},
    "seed": 7,
}


def service_address(name, port):
    return f"{RELEASE}-{name}.{NAMESPACE}.svc.{local_cluster.CLUSTER_DOMAIN}:{port}"


def tandem_cli(cluster, work, *args):
    """Runs tandem-cli against the trainer's Service name; returns its output."""
    token_file = work / "token"
    token_file.write_bytes(cluster.secret(f"{RELEASE}-auth")["token"])
    result = subprocess.run(
        ["tandem-cli", f"--trainer={service_address('trainer', 50051)}",
         f"--auth_token_file={token_file}", *args],
        env=cluster.base_env, capture_output=True, text=True, timeout=JOB_TIMEOUT_SECONDS)
    if result.returncode != 0:
        raise AssertionError(f"tandem-cli {args[0]} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def submit_short_job(cluster, work, **fields):
    """Submits SHORT_JOB (with `fields` set) and watches it to the end; returns the output."""
    trainer = cluster.pod(f"{RELEASE}-trainer-0").containers[0]
    spec = dict(SHORT_JOB, **fields)
    # The path inside the trainer's container, where its init container wrote the model.
    spec["base_model_path"] = trainer.host_path("/models/base_model.safetensors")
    spec_file = work / "job.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    return tandem_cli(cluster, work, "submit", f"--spec={spec_file}", "--watch")


class Prometheus:
    """A real Prometheus on loopback, configured from the render's monitoring objects."""

    def __init__(self, cluster, directory, address):
        self.address = address
        rules = directory / "rules.yaml"
        rules.write_text(yaml.safe_dump({"groups": cluster.rule_groups()}))
        scrape_configs = cluster.scrape_configs("1s")
        self.targets = sum(len(scrape["static_configs"]) for scrape in scrape_configs)
        config = directory / "prometheus.yaml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": scrape_configs,
        }))
        with open(directory / "prometheus.log", "ab") as log:  # Popen keeps its own copy.
            self.process = subprocess.Popen(
                ["prometheus", f"--config.file={config}",
                 f"--storage.tsdb.path={directory / 'tsdb'}", f"--web.listen-address={address}"],
                stdout=log, stderr=subprocess.STDOUT)
        self._wait_until_ready()

    def _wait_until_ready(self):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=2)
                return
            except OSError:
                time.sleep(0.25)
        raise AssertionError("Prometheus did not become ready")

    def api(self, path, **params):
        url = f"http://{self.address}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        if body["status"] != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    def wait_until_scraping(self):
        """Waits until every target is discovered and answers (discovery syncs every 5 s)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            active = self.api("targets")["activeTargets"]
            if len(active) == self.targets and all(t["health"] == "up" for t in active):
                return
            time.sleep(0.5)
        raise AssertionError(f"Prometheus does not scrape all {self.targets} targets: {active}")

    def query(self, expr):
        return self.api("query", query=expr)["result"]

    def query_since(self, expr, start):
        """Series `expr` had at any point since `start` (Unix seconds), as a dashboard's time
        range shows them: a job's series end with the job."""
        return self.api("query_range", query=expr, start=start, end=time.time(), step=1)["result"]

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)


def dashboard_queries(chart):
    """(dashboard, panel title, PromQL with variables set to All) of every panel and variable."""
    for path in sorted((chart / "files/dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text())
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                series = variable["query"]["query"]  # label_values(METRIC, LABEL)
                for name, value in DASHBOARD_VARIABLES.items():
                    series = series.replace(name, value)
                yield path.name, f"variable {variable['name']}", series[len("label_values("):series.rindex(",")]
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                expr = target["expr"]
                for variable, value in DASHBOARD_VARIABLES.items():
                    expr = expr.replace(variable, value)
                yield path.name, panel["title"], expr


def check_every_query_returns_a_series(prometheus, cluster, chart, since):
    queries = list(dashboard_queries(chart))
    records = [rule["record"] for group in cluster.rule_groups() for rule in group["rules"]
               if "record" in rule]
    empty = [f"{name}: {title}: {expr}" for name, title, expr in queries
             if not prometheus.query_since(expr, since)]
    empty += [f"recording rule {record}" for record in records
              if not prometheus.query_since(record, since)]
    if empty:
        raise AssertionError("queries with no series:\n  " + "\n  ".join(empty))
    alerts = sum("alert" in rule for group in cluster.rule_groups() for rule in group["rules"])
    print(f"{len(queries)} dashboard queries and {len(records)} recording rules returned series "
          f"({alerts} alerts loaded)")


def check_a_killed_service_goes_pending(prometheus, cluster):
    cluster.pod(f"{RELEASE}-weight-store-0").kill()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for alert in prometheus.api("alerts")["alerts"]:
            labels = alert["labels"]
            if (labels["alertname"] == "TandemServiceDown" and
                    labels.get("job") == "tandem-weight-store" and alert["state"] == "pending"):
                print("TandemServiceDown is pending for the killed weight-store")
                return
        time.sleep(0.5)
    raise AssertionError(f"no pending TandemServiceDown: {prometheus.api('alerts')}")


def check_export_through_the_services(cluster, work, submitted):
    """The NOTES' export step: tandem-cli reads the job from the trainer's Service and its
    adapter from the weight-store's (the second port-forward) into a PEFT directory."""
    out = work / "exported-adapter"
    print(tandem_cli(cluster, work, "export", submitted.splitlines()[0], f"--out={out}",
                     f"--weight_store={service_address('weight-store', 50053)}"))
    missing = [name for name in ("adapter_config.json", "adapter_model.safetensors")
               if not (out / name).is_file()]
    if missing:
        raise AssertionError(f"tandem-cli export wrote no {missing} into {out}")


def refuse_one_call(cluster, work):
    """A call the trainer refuses (NOT_FOUND), so that the RPC error ratio has a series however
    smoothly the rest of the run went."""
    try:
        tandem_cli(cluster, work, "get", "no-such-job")
    except AssertionError as refused:
        if "job no-such-job not found" in str(refused):
            return
        raise
    raise AssertionError("tandem-cli get of a job that does not exist succeeded")


def run_monitoring_case(cluster, chart, work, subnet):
    prometheus = Prometheus(cluster, work, f"127.{subnet}.0.2:9090")
    try:
        prometheus.wait_until_scraping()
        started = time.time()
        # Long enough (a few seconds) for scrapes to see it running: the progress recording
        # rule has a series only while a job runs.
        submitted = submit_short_job(cluster, work, num_steps=30)
        print(submitted)
        check_export_through_the_services(cluster, work, submitted)
        refuse_one_call(cluster, work)
        time.sleep(3)  # A last scrape after the job, and a rule evaluation over it.
        check_every_query_returns_a_series(prometheus, cluster, chart, since=started)
        check_a_killed_service_goes_pending(prometheus, cluster)
    finally:
        prometheus.stop()


def metric_value(pod, port, series):
    """The value of `series` (name and labels, as exported) on a pod's /metrics; 0 if absent."""
    with urllib.request.urlopen(f"http://{pod.ip}:{port}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.rsplit(" ", 1)[0] == series:
                return float(line.split()[-1])
    return 0.0


def rollout_pods(cluster):
    return sorted((pod for pod in cluster.pods
                   if pod.labels["app.kubernetes.io/component"] == "rollout"),
                  key=lambda pod: pod.name)


def run_replicas_case(cluster, chart, work, subnet):
    print(submit_short_job(cluster, work))
    served = {pod.name: metric_value(pod, 9452, "tandem_rollout_samples_total")
              for pod in rollout_pods(cluster)}
    print(f"samples per rollout replica: {served}")
    if len(served) != 3 or min(served.values()) == 0:
        raise AssertionError(f"the job's prompts did not reach all three replicas: {served}")


def run_relay_case(cluster, chart, work, subnet):
    """The replicas of a relay chain: the first reads every adapter version from the
    weight-store, each other one from the replica before it, and all three generate."""
    print(submit_short_job(cluster, work))
    fetches = {pod.name: {source: metric_value(
                   pod, 9452, f'tandem_rollout_adapter_fetches_total{{source="{source}"}}')
                   for source in ("store", "relay")}
               for pod in rollout_pods(cluster)}
    print(f"adapter fetches per rollout replica: {fetches}")
    (head, *rest) = fetches.values()
    if head["store"] == 0 or head["relay"] != 0:
        raise AssertionError(f"the chain's first replica did not read from the store: {fetches}")
    if len(rest) != 2 or any(f["relay"] == 0 or f["store"] != 0 for f in rest):
        raise AssertionError(f"replicas 1 and 2 did not read every version by relay: {fetches}")
    served = [metric_value(pod, 9452, "tandem_rollout_samples_total")
              for pod in rollout_pods(cluster)]
    if min(served) == 0:
        raise AssertionError(f"not every replica of the chain generated: {served}")


def run_ranks_case(cluster, chart, work, subnet):
    output = submit_short_job(cluster, work, parallelism={"data_parallel": 2})
    print(output)
    job = json.loads(tandem_cli(cluster, work, "get", output.splitlines()[0]))
    ranks = job["latestMetrics"].get("ranks", [])
    samples = [int(rank.get("samples", 0)) for rank in ranks]
    print(f"samples per trainer rank in the last step: {samples}")
    if samples != [48, 48]:
        raise AssertionError(f"the job did not train on both trainer pods: {ranks}")


def reserve_loopback_subnet():
    """Picks S for 127.S.0.0/16, the run's own network, so that concurrent runs and other
    tests never share an address; S is held by a socket bound to 127.S.0.1 until the caller
    drops it. (Bazel's sandboxes share the network but not PIDs, so no PID can choose S.)"""
    for subnet in random.sample(range(1, 255), 254):
        reservation = socket.socket()
        try:
            reservation.bind((f"127.{subnet}.0.1", 47999))
            return subnet, reservation
        except OSError:
            reservation.close()
    raise AssertionError("every 127.S.0.0/16 is taken")


CASES = {"cpu": run_monitoring_case, "cpu-replicas3": run_replicas_case,
         "cpu-ranks2": run_ranks_case, "cpu-relay3": run_relay_case}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=sorted(CASES), required=True)
    args = parser.parse_args()
    chart = RUNFILES / "deploy/helm/tandem"
    binaries = local_cluster.image_binaries(RUNFILES / "deploy/docker/Dockerfile", BUILD_ROOT)
    subnet, _reservation = reserve_loopback_subnet()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as directory:
        work = pathlib.Path(directory)
        manifests = local_cluster.load_manifests(chart / f"tests/golden/{args.case}.yaml")
        cluster = local_cluster.LocalCluster(manifests, binaries, work, subnet)
        try:
            cluster.start()
            print(f"{len(cluster.pods)} pods ready after {time.monotonic() - started:.1f} s")
            CASES[args.case](cluster, chart, work, subnet)
        finally:
            exits = cluster.stop()
        unclean = {pod: codes for pod, codes in exits.items() if any(codes.values())}
        if unclean:
            raise AssertionError(f"containers that did not drain and exit 0 on SIGTERM: {unclean}")
        failures = cluster.probe_failures()
        if failures:
            raise AssertionError(f"probes failed while the pods ran: {failures}")
    print(f"{args.case}: passed in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
