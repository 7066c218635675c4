#!/usr/bin/env python3
"""A chaos soak: a long job on the four services while they are killed and paused.

    tools/chaos/soak.py --bin=bazel-bin --out=DIR [--minutes=10] [--steps=2000] [--seed=N]
                        [--cluster [--rate=1gbit] [--shape=SERVICE=RATE]]

Starts the four services on loopback (stores in DIR, a bearer token, UCX over tcp on lo),
submits jobs/demo.yaml with --steps steps and, for --minutes: every 20-40 s kills a random
service with SIGKILL and restarts it 1-3 s later with the same flags and data; now and then
pauses a store (SIGSTOP for 2-5 s, then SIGCONT). Meanwhile the soak is a client of its own:
it appends sealed route records to router-replay and remembers every one router-replay
acknowledged, and it remembers every adapter version the job reported as published. After the
job ends (or the time is up) it checks each against the stores:

    acknowledged route records lost   records acked sealed that FetchRoutes does not return
                                      with the rows that were appended (must be 0)
    torn versions                     reported versions that cannot be fetched whole, by
                                      tandem-cli export, which checks every tensor's xxh3
                                      (must be 0)

and prints a report: whether the job finished, its attempts and the steps it redid, the kills
and pauses per service, and those counts. With --cluster (root needed) every service and the
soak's own client run on hosts of their own in the one-machine cluster (tools/cluster: network
namespaces on links shaped to --rate, one service's link to the rate --shape gives, e.g.
weight_store=10mbit), so every byte between them crosses a shaped link. Exit status 0 when the job SUCCEEDED and nothing was
lost or torn. Needs the Python SDK's dependencies (Debian python3-grpcio etc., tools/setup);
it installs the SDK into DIR/venv and runs there.
"""

import argparse
import dataclasses
import os
import pathlib
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "cluster"))
SERVICES = ["weight_store", "router_replay", "rollout", "trainer"]
STORES = ["weight_store", "router_replay"]
# Cluster hosts (names without underscores): the soak's client first, then one per service.
HOSTS = ["client"] + [name.replace("_", "") for name in SERVICES]


def in_venv(out: pathlib.Path) -> None:
    """Re-runs this script in a venv with the SDK installed, unless it already runs there."""
    venv = out / "venv"
    if pathlib.Path(sys.prefix) == venv:
        return
    if not (venv / "bin" / "python").exists():
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                       check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-build-isolation",
                        "--no-index", str(REPO / "python")], check=True)
    os.execv(str(venv / "bin" / "python"), [str(venv / "bin" / "python"), *sys.argv])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class Service:
    name: str
    command: list
    log: pathlib.Path
    ucx_device: str
    process: subprocess.Popen = None
    kills: int = 0
    pauses: int = 0
    crashes: int = 0

    def start(self) -> None:
        # In a cluster the command is `ip netns exec NS binary ...`, which execs the binary: its
        # process is the service's, for the signals below.
        env = dict(os.environ, UCX_NET_DEVICES=self.ucx_device)
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                            env=env)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.kills += 1

    def pause(self, seconds: float) -> None:
        self.process.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        self.process.send_signal(signal.SIGCONT)
        self.pauses += 1

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


class Deployment:
    """The four services on loopback, or each on its host of a cluster whose run id is
    `cluster_run` (this process then runs on the cluster's client host)."""

    def __init__(self, bin_dir: pathlib.Path, out: pathlib.Path, base_model: pathlib.Path,
                 cluster_run: str = ""):
        import cluster  # tools/cluster, for its addressing.
        self.ports = {name: free_port() for name in SERVICES}
        hosts = {name: "127.0.0.1" for name in SERVICES}
        prefix = {name: [] for name in SERVICES}
        if cluster_run:
            for name in SERVICES:
                host = name.replace("_", "")
                hosts[name] = f"{cluster.SUBNET}.{HOSTS.index(host) + 1}"
                prefix[name] = ["ip", "netns", "exec", f"{cluster_run}-{host}"]
        self.token_file = out / "auth_token"
        self.token_file.write_text(secrets.token_urlsafe(24))
        self.token_file.chmod(0o600)
        self.token = self.token_file.read_text()
        data = out / "data"
        data.mkdir(exist_ok=True)

        def address(name):
            return f"{hosts[name]}:{self.ports[name]}"

        stores = [f"--weight_store={address('weight_store')}",
                  f"--router_replay={address('router_replay')}"]
        flags = {
            # Every version stays, so each one the job reported can be checked afterwards.
            "weight_store": [f"--data_dir={data}/weight-store", "--ucx_transports=tcp",
                             "--keep_versions=100000"],
            "router_replay": [f"--data_dir={data}/router-replay"],
            "rollout": [f"--base_model={base_model}", "--ucx_transports=tcp", *stores],
            "trainer": [f"--data_dir={data}/trainer", "--ucx_transports=tcp",
                        f"--rollout={address('rollout')}", *stores],
        }
        self.services = {
            name: Service(name, [*prefix[name], str(bin_dir / f"services/{name}/{name}"),
                                 f"--host={hosts[name]}", f"--port={self.ports[name]}",
                                 f"--metrics_port={free_port()}",
                                 f"--auth_token_file={self.token_file}", *flags[name]],
                          out / f"{name}.log", "eth0" if cluster_run else "lo")
            for name in SERVICES}
        self.address = address

    def start(self) -> None:
        for service in self.services.values():
            service.start()

    def stop(self) -> None:
        for name in reversed(SERVICES):
            self.services[name].stop()


class Chaos(threading.Thread):
    """Kills a random service every 20-40 s (restarted 1-3 s later) and pauses a store every
    45-75 s for 2-5 s, until stopped."""

    def __init__(self, deployment: Deployment, rng: random.Random, seconds: float):
        super().__init__(daemon=True)
        self.deployment = deployment
        self.rng = rng
        self.seconds = seconds
        self.ends_at = time.monotonic() + seconds
        self.stopping = threading.Event()
        self.events = []

    def start(self) -> None:
        self.ends_at = time.monotonic() + self.seconds
        super().start()

    def run(self) -> None:
        next_kill = time.monotonic() + self.rng.uniform(20, 40)
        next_pause = time.monotonic() + self.rng.uniform(45, 75)
        while not self.stopping.wait(0.2):
            now = time.monotonic()
            crashed = [s for s in self.deployment.services.values() if s.process.poll() is not None]
            if crashed:  # Exited without being killed: a finding, reported; restarted.
                service = crashed[0]
                service.crashes += 1
                self.events.append(f"{service.name} exited by itself "
                                   f"(status {service.process.returncode}); restarted")
                service.start()
            elif now >= next_kill:
                service = self.deployment.services[self.rng.choice(SERVICES)]
                service.kill()
                down = self.rng.uniform(1, 3)
                time.sleep(down)
                service.start()
                self.events.append(f"killed {service.name}, restarted after {down:.1f} s")
                next_kill = time.monotonic() + self.rng.uniform(20, 40)
            elif now >= next_pause:
                service = self.deployment.services[self.rng.choice(STORES)]
                paused = self.rng.uniform(2, 5)
                service.pause(paused)
                self.events.append(f"paused {service.name} for {paused:.1f} s")
                next_pause = time.monotonic() + self.rng.uniform(45, 75)
            else:
                continue
            print(f"[{time.strftime('%H:%M:%S')}] {self.events[-1]}", flush=True)


class RouteWriter(threading.Thread):
    """Appends small sealed route records and remembers the ones router-replay acknowledged
    sealed, with their rows."""

    LAYERS, TOP_K, EXPERTS, ROWS = [1, 3], 2, 8, 8

    def __init__(self, address: str, token: str, rng: random.Random):
        super().__init__(daemon=True)
        import grpc  # In the venv only.
        from tandem.routerreplay.v1 import router_replay_pb2_grpc
        self.channel = grpc.insecure_channel(address)
        self.stub = router_replay_pb2_grpc.RouterReplayServiceStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),)
        self.rng = rng
        self.stopping = threading.Event()
        self.acked = {}  # sample_id -> rows
        self.attempts = 0

    def run(self) -> None:
        import grpc
        from tandem.routerreplay.v1 import router_replay_pb2
        from tandem.type.v1 import common_pb2
        while not self.stopping.wait(0.1):
            self.attempts += 1
            sample_id = f"sample-{self.attempts}"
            rows = bytearray()
            for _ in range(self.ROWS * len(self.LAYERS)):
                for expert in self.rng.sample(range(self.EXPERTS), self.TOP_K):
                    rows += expert.to_bytes(2, "little", signed=True)
            request = router_replay_pb2.AppendRequest(
                key=common_pb2.RouteRecordKey(job_id="soak-acks", policy_version=0,
                                              sample_id=sample_id),
                moe_layer_indices=self.LAYERS, top_k=self.TOP_K, num_experts=self.EXPERTS,
                token_offset=0, num_tokens=self.ROWS, rows=bytes(rows), seal=True)
            try:
                response = self.stub.Append(iter([request]), timeout=5, metadata=self.metadata)
            except grpc.RpcError:
                continue  # Not acknowledged: nothing promised.
            ack = response.records[0]
            if ack.sealed and ack.acknowledged_rows == self.ROWS:
                self.acked[sample_id] = bytes(rows)

    def lost(self) -> list:
        """The acknowledged records that router-replay no longer returns as appended."""
        from tandem.routerreplay.v1 import router_replay_pb2
        from tandem.type.v1 import common_pb2
        lost = []
        ids = sorted(self.acked)
        for begin in range(0, len(ids), 500):
            batch = ids[begin:begin + 500]
            request = router_replay_pb2.FetchRoutesRequest(records=router_replay_pb2.RecordList(
                records=[router_replay_pb2.RecordRequest(key=common_pb2.RouteRecordKey(
                    job_id="soak-acks", policy_version=0, sample_id=i)) for i in batch]),
                allow_partial=True)
            got = {}
            for message in self.stub.FetchRoutes(request, timeout=60, metadata=self.metadata):
                if message.status == router_replay_pb2.RECORD_STATUS_COMPLETE:
                    got[message.key.sample_id] = got.get(message.key.sample_id, b"") + message.rows
            lost += [i for i in batch if got.get(i) != self.acked[i]]
        return lost


def job_spec(steps: int, base_model: pathlib.Path) -> dict:
    import yaml
    spec = yaml.safe_load((REPO / "jobs/demo.yaml").read_text())
    spec.update(num_steps=steps, base_model_path=str(base_model), display_name="chaos-soak",
                checkpoint_every=10)
    return spec


def follow(client, job_id: str, deadline: float, chaos: Chaos):
    """Polls the job through restarts until it ends or `deadline`; returns the job proto last
    seen, the versions it reported, its attempts and the steps it redid."""
    import tandem
    versions, furthest, redone, attempt, job = set(), 0, 0, 0, None
    while time.monotonic() < deadline:
        if time.monotonic() > chaos.ends_at:
            chaos.stopping.set()
        try:
            job = client.get_job(job_id)
        except tandem.TandemError:
            time.sleep(1)
            continue
        proto = job.proto
        if proto.attempt > attempt:
            if attempt > 0:
                redone += max(0, furthest - proto.attempt_start_step)
            attempt = proto.attempt
        furthest = max(furthest, proto.current_step)
        if proto.policy_version > 0:
            versions.add(proto.policy_version)
        if job.done:
            break
        time.sleep(1)
    return job, versions, attempt, redone


def torn_versions(bin_dir: pathlib.Path, deployment: Deployment, job_id: str, versions,
                  out: pathlib.Path) -> list:
    torn = []
    for version in sorted(versions):
        exported = subprocess.run(
            [str(bin_dir / "tools/cli/tandem-cli"), "export", job_id,
             f"--out={out / 'exports' / str(version)}", f"--version={version}",
             f"--trainer={deployment.address('trainer')}",
             f"--weight_store={deployment.address('weight_store')}",
             f"--auth_token_file={deployment.token_file}"],
            capture_output=True, text=True)
        if exported.returncode != 0:
            torn.append((version, exported.stderr.strip()[-200:]))
    return torn


def run_in_cluster(args) -> int:
    """Builds the cluster, runs this soak on its client host, and removes the cluster."""
    import cluster
    host_rates = {}
    if args.shape:
        service, _, rate = args.shape.partition("=")
        if service not in SERVICES or not rate:
            raise SystemExit(f"--shape: SERVICE=RATE with SERVICE one of {SERVICES}")
        host_rates[service.replace("_", "")] = rate
    with cluster.Cluster(HOSTS, rate=args.rate, host_rates=host_rates) as net:
        print(f"cluster {net.run_id}: links {args.rate}"
              + (f", {args.shape}" if args.shape else ""), flush=True)
        return net.run("client", [sys.executable, *sys.argv, f"--inside={net.run_id}"]).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default="bazel-bin", type=pathlib.Path)
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--minutes", default=10.0, type=float)
    parser.add_argument("--steps", default=2000, type=int)
    parser.add_argument("--seed", default=1, type=int)
    parser.add_argument("--cluster", action="store_true", help="hosts in network namespaces")
    parser.add_argument("--rate", default="1gbit", help="--cluster: every link's rate")
    parser.add_argument("--shape", default="", help="--cluster: SERVICE=RATE for one link")
    parser.add_argument("--inside", default="", help=argparse.SUPPRESS)  # The cluster's run id.
    args = parser.parse_args()
    args.out = args.out.resolve()
    args.bin = args.bin.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    in_venv(args.out)
    if args.cluster and not args.inside:
        return run_in_cluster(args)
    import tandem

    base_model = args.out / "base_model.safetensors"
    if not base_model.exists():
        subprocess.run([str(args.bin / "engine/make_base_model"), "--digits=1", "--max_steps=100",
                        f"--out={base_model}"], check=True, stdout=subprocess.DEVNULL)
    rng = random.Random(args.seed)
    deployment = Deployment(args.bin, args.out, base_model, cluster_run=args.inside)
    deployment.start()
    chaos = Chaos(deployment, rng, args.minutes * 60)
    writer = None
    try:
        client = tandem.Client(deployment.address("trainer"), token=deployment.token)
        for _ in range(60):  # The trainer comes up.
            try:
                job = client.submit(job_spec(args.steps, base_model), request_id="chaos-soak")
                break
            except tandem.TandemError:
                time.sleep(0.5)
        print(f"job {job.id}: {args.steps} steps; chaos for {args.minutes} minutes", flush=True)
        writer = RouteWriter(deployment.address("router_replay"), deployment.token, rng)
        writer.start()
        chaos.start()
        job, versions, attempts, redone = follow(
            client, job.id, chaos.ends_at + 15 * 60, chaos)
        chaos.stopping.set()
        chaos.join()
        writer.stopping.set()
        writer.join()
        lost = writer.lost()
        torn = torn_versions(args.bin, deployment, job.id, versions, args.out)
    finally:
        chaos.stopping.set()
        deployment.stop()

    finished = job is not None and job.state == "JOB_STATE_SUCCEEDED"
    print("\nchaos soak report")
    print(f"  job {job.id if job else '?'}: {job.state if job else 'never seen'}, "
          f"step {job.proto.current_step if job else 0}/{args.steps}, attempts {attempts}, "
          f"steps redone {redone}")
    for name in SERVICES:
        service = deployment.services[name]
        print(f"  {name}: killed {service.kills}, paused {service.pauses}, "
              f"exited by itself {service.crashes}")
    print(f"  route records acknowledged {len(writer.acked)} of {writer.attempts} appended, "
          f"lost {len(lost)}")
    print(f"  versions reported {len(versions)}, torn {len(torn)}")
    for version, why in torn[:5]:
        print(f"    version {version}: {why}")
    crashes = sum(service.crashes for service in deployment.services.values())
    return 0 if finished and not lost and not torn and not crashes else 1


if __name__ == "__main__":
    sys.exit(main())
