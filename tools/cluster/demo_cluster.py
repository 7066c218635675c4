#!/usr/bin/env python3
"""The demo job on a cluster on one machine: every service process on a host of its own.

    demo_cluster.py --bin=bazel-bin --job=jobs/demo.yaml --base_model=FILE --out=DIR
                    [--trainer_ranks=4] [--expert_parallel=1] [--balance_experts]
                    [--rollouts=2] [--relay_rollouts] [--rate=1gbit]
                    [--steps=N]

Hosts (network namespaces joined by links shaped to --rate, see cluster.py): trainer0..N-1 (a
trainer deployment of N ranks; the job runs on all of them, in expert-parallel groups of
--expert_parallel ranks), rollout0..R-1, the
weight-store and router-replay. Every byte between services crosses the links: gRPC, UCX (tcp on
eth0) and Gloo. The job is submitted from trainer0's host, as a user next to the Job API would.
Printed: the job's progress, each host's link bytes during the job, where each rollout replica
fetched its adapter versions from (the store, or with --relay_rollouts the replica before it in a
chain), and the mean step-time breakdown (from the job's per-step metrics). Everything the run made is removed at its end.
"""

import argparse
import csv
import json
import os
import pathlib
import secrets
import shutil
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

PORTS = {"trainer": 50051, "rollout": 50052, "weightstore": 50053, "routerreplay": 50054}
METRICS_PORTS = {"trainer": 9451, "rollout": 9452, "weightstore": 9453, "routerreplay": 9454}
HEALTH = {"trainer": "tandem.trainer.v1.JobService", "rollout": "tandem.rollout.v1.RolloutService",
          "weightstore": "tandem.weightstore.v1.WeightStoreService",
          "routerreplay": "tandem.routerreplay.v1.RouterReplayService"}
# Per-step metrics (StepMetrics) of the breakdown, in the order a step runs them.
BREAKDOWN = ["generation_seconds", "route_fetch_seconds", "training_seconds",
             "collective_seconds", "expert_exchange_seconds", "publish_seconds", "swap_seconds",
             "step_seconds"]


def kind(host):
    return host.rstrip("0123456789")


class Demo:
    def __init__(self, args, net):
        self.args = args
        self.net = net
        self.bin = pathlib.Path(args.bin).resolve()
        self.out = pathlib.Path(args.out).resolve()
        self.token = self.out / "auth_token"
        self.token.write_text(secrets.token_urlsafe(24))
        self.token.chmod(0o600)

    def target(self, host):
        return f"{self.net.address(host)}:{PORTS[kind(host)]}"

    def flags(self, host):
        """A service's own flags, as ./tandem demo gives them on loopback."""
        role = kind(host)
        data = self.out / host
        # Each run starts from empty stores: a job left by an earlier run in the same --out would
        # answer the submit in its place (the same spec, so the same request id).
        shutil.rmtree(data, ignore_errors=True)
        if role == "weightstore":
            return ["services/weight_store/weight_store", f"--data_dir={data}",
                    "--ucx_transports=tcp"]
        if role == "routerreplay":
            return ["services/router_replay/router_replay", f"--data_dir={data}"]
        if role == "rollout":
            flags = ["services/rollout/rollout", f"--base_model={self.args.base_model}",
                     f"--weight_store={self.target('weightstore')}",
                     f"--router_replay={self.target('routerreplay')}", "--ucx_transports=tcp"]
            index = int(host[len("rollout"):])
            if self.args.relay_rollouts:  # A chain: rollout i reads from rollout i-1.
                flags.append("--relay")
                if index > 0:
                    flags.append(f"--relay_from={self.target(f'rollout{index - 1}')}")
            return flags
        rank = int(host[len("trainer"):])
        rollouts = ",".join(self.target(f"rollout{r}") for r in range(self.args.rollouts))
        flags = ["services/trainer/trainer", f"--data_dir={data}", "--ucx_transports=tcp",
                 f"--ranks={self.args.trainer_ranks}", f"--rank={rank}",
                 f"--rank_address={self.net.address(host)}", f"--rollout={rollouts}",
                 f"--weight_store={self.target('weightstore')}",
                 f"--router_replay={self.target('routerreplay')}",
                 f"--expert_link_gbps={cluster.parse_rate(self.args.rate) / 1e9}"]
        if rank > 0:
            flags.append(f"--rank0={self.target('trainer0')}")
        return flags

    def start(self, host):
        binary, *flags = self.flags(host)
        argv = [str(self.bin / binary), f"--host={self.net.address(host)}",
                f"--port={PORTS[kind(host)]}", f"--metrics_port={METRICS_PORTS[kind(host)]}",
                f"--auth_token_file={self.token}", *flags]
        # UCX on the host's link only, as on a machine with one network interface.
        env = dict(os.environ, UCX_NET_DEVICES="eth0", UCX_TLS="tcp")
        log = open(self.out / f"{host}.log", "wb")
        self.net.spawn(host, argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    def await_serving(self, host):
        # A trainer of rank > 0 serves no API: its health as a whole.
        joins = kind(host) == "trainer" and host != "trainer0"
        service = "" if joins else HEALTH[kind(host)]
        result = self.net.run(host, [str(self.bin / "tools/health_check/health_check"),
                                     f"--target={self.target(host)}", f"--service={service}",
                                     "--wait=60s"], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{host} did not become ready; see {self.out}/{host}.log")

    def job_file(self):
        spec = yaml.safe_load(pathlib.Path(self.args.job).read_text())
        spec["base_model_path"] = str(pathlib.Path(self.args.base_model).resolve())
        experts = self.args.expert_parallel
        spec["parallelism"] = {"data_parallel": self.args.trainer_ranks // experts,
                               "expert_parallel": experts,
                               "balance_experts": self.args.balance_experts}
        if self.args.steps:
            spec["num_steps"] = self.args.steps
        path = self.out / "job.yaml"
        path.write_text(yaml.safe_dump(spec))
        return path

    def submit(self):
        tsv = self.out / "steps.tsv"
        result = self.net.run("trainer0", [
            str(self.bin / "tools/cli/tandem-cli"), f"--trainer={self.target('trainer0')}",
            f"--auth_token_file={self.token}", "submit", f"--spec={self.job_file()}", "--watch",
            f"--metrics_tsv={tsv}"], capture_output=True, text=True)
        (self.out / "job.log").write_text(result.stdout + result.stderr)
        lines = result.stdout.splitlines()
        for line in lines[:1] + lines[-3:]:
            print(f"  {line}")
        if result.returncode != 0:
            raise RuntimeError(f"the job failed:\n{result.stderr}")
        return tsv, lines[0].strip()

    def adapter_fetches(self, host):
        """Adapter versions a rollout fetched, by source (tandem_rollout_adapter_fetches_total)."""
        url = f"http://{self.net.address(host)}:{METRICS_PORTS['rollout']}/metrics"
        text = self.net.run(host, ["python3", "-c", "import sys, urllib.request; sys.stdout.write("
                                   f"urllib.request.urlopen({url!r}).read().decode())"],
                            capture_output=True, text=True, check=True).stdout
        fetches = {"store": 0, "relay": 0}
        for line in text.splitlines():
            for source in fetches:
                if line.startswith(f'tandem_rollout_adapter_fetches_total{{source="{source}"}}'):
                    fetches[source] = int(float(line.split()[-1]))
        return fetches

    def last_step_ranks(self, job_id):
        """Each rank's share of the job's last step (Job.latest_metrics.ranks)."""
        result = self.net.run("trainer0", [
            str(self.bin / "tools/cli/tandem-cli"), f"--trainer={self.target('trainer0')}",
            f"--auth_token_file={self.token}", "get", job_id], capture_output=True, text=True,
            check=True)
        return json.loads(result.stdout)["latestMetrics"]["ranks"]


def print_link_bytes(before, after):
    print(f"\n{'host':<14}{'sent MB':>10}{'received MB':>13}   (link bytes during the job)")
    for host in after:
        sent = (after[host]["tx"] - before[host]["tx"]) / 1e6
        received = (after[host]["rx"] - before[host]["rx"]) / 1e6
        print(f"{host:<14}{sent:>10.2f}{received:>13.2f}")


def print_breakdown(tsv):
    rows = list(csv.DictReader(tsv.open(), delimiter="\t"))
    print(f"\nmean step time over {len(rows)} steps (s):")
    for field in BREAKDOWN:
        mean = sum(float(row[field]) for row in rows) / len(rows)
        print(f"  {field.replace('_seconds', ''):<12}{mean:8.3f}")
    megabytes = sum(int(row["collective_bytes"]) for row in rows) / len(rows) / 1e6
    print(f"  collective bytes per step from rank 0: {megabytes:.2f} MB "
          "(training's share is in 'training'; collective includes waits for other ranks)")
    moved = sum(int(row["experts_moved"]) for row in rows)
    replicas = sum(int(row["expert_replicas"]) for row in rows)
    if moved or replicas:
        def mean(field):
            return sum(float(row[field]) for row in rows) / len(rows)
        print(f"  experts moved: {moved}, replicas: {replicas} in {len(rows)} steps (over every "
              f"MoE layer); per-layer load imbalance (max/mean rows per rank), mean over layers "
              f"{mean('expert_imbalance_before'):.3f} -> {mean('expert_imbalance_after'):.3f}, "
              f"worst layer {mean('expert_imbalance_worst_before'):.3f} -> "
              f"{mean('expert_imbalance_worst_after'):.3f}; "
              f"{mean('expert_bytes_moved') / 1e6:.2f} MB moved per step")
    exchanged = sum(int(row["expert_exchange_bytes"]) for row in rows) / len(rows) / 1e6
    if exchanged:
        print(f"  expert all-to-all bytes per step sent by rank 0: {exchanged:.2f} MB "
              "(inside 'training', like expert_exchange)")


def print_rank_shares(ranks):
    print("\nthe last step by rank: samples, response tokens, routed rows its experts computed "
          "and their seconds")
    for share in ranks:
        print(f"  rank {share.get('rank', 0)}: {share.get('samples', 0):>6} "
              f"{share.get('responseTokens', 0):>8} {share.get('expertRows', 0):>10} "
              f"{share.get('expertSeconds', 0):>8.4f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", required=True, help="where the built binaries are (bazel-bin)")
    parser.add_argument("--job", required=True, help="job spec file")
    parser.add_argument("--base_model", required=True, help="the base model rollout serves")
    parser.add_argument("--out", required=True, help="logs, data and the step metrics")
    parser.add_argument("--trainer_ranks", type=int, default=4)
    parser.add_argument("--expert_parallel", type=int, default=1,
                        help="ranks per expert-parallel group (divides --trainer_ranks)")
    parser.add_argument("--balance_experts", action="store_true",
                        help="re-place the experts before each step by its routed load")
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument("--rate", default="1gbit", help="every link's rate, e.g. 100mbit")
    parser.add_argument("--relay_rollouts", action="store_true",
                        help="rollout replicas relay adapter versions along a chain (--relay)")
    parser.add_argument("--steps", type=int, default=0, help="override the job's num_steps")
    args = parser.parse_args()
    if args.expert_parallel < 1 or args.trainer_ranks % args.expert_parallel:
        parser.error("--expert_parallel must divide --trainer_ranks")
    pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
    hosts = ([f"trainer{r}" for r in range(args.trainer_ranks)] +
             [f"rollout{r}" for r in range(args.rollouts)] + ["weightstore", "routerreplay"])
    with cluster.Cluster(hosts, rate=args.rate) as net:
        print(f"tandem: a cluster of {len(hosts)} hosts in network namespaces "
              f"({net.run_id}-*), links shaped to {args.rate}: "
              f"{', '.join(f'{h} {net.address(h)}' for h in hosts)}")
        demo = Demo(args, net)
        for host in ["weightstore", "routerreplay"] + hosts[:-2]:
            demo.start(host)
        for host in hosts:
            demo.await_serving(host)
        print(f"tandem: all services ready; the job on {args.trainer_ranks} trainer ranks and "
              f"{args.rollouts} rollout replicas")
        before = {host: net.link_bytes(host) for host in hosts}
        tsv, job_id = demo.submit()
        after = {host: net.link_bytes(host) for host in hosts}
        ranks = demo.last_step_ranks(job_id)
        fetches = {host: demo.adapter_fetches(host) for host in hosts if kind(host) == "rollout"}
    print_link_bytes(before, after)
    print("\nadapter versions fetched, by source: " + ", ".join(
        f"{host} store {counts['store']} relay {counts['relay']}"
        for host, counts in fetches.items()))
    print_breakdown(tsv)
    print_rank_shares(ranks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
