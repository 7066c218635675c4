#!/usr/bin/env python3
"""Refit across a cluster on one machine: trainer ranks publish their shards of a version to a
weight-store, rollout replicas fetch it, every host in its own network namespace behind a
link shaped to one rate (tools/cluster/cluster.py).

Each run prints, per version after the first (a warm-up): the upload (every rank's "begin" to
the last rank's shards in the store) and the refit (the commit to the last replica holding the
version), the refit against its bound -- every replica must receive the version's V bytes over
its own link, so no refit beats V / rate -- and the CPU all the run's processes used, as a
share of the machine. Strategies: "store", every replica from the store by UCX (the plan pushed
with the announcement); "chain", replicas relaying to replicas (the store -> replica0 ->
replica1 -> ..., each forwarding what it has as it arrives, AdapterRelayService).

    refit_bench.py --bin=bazel-bin --ranks=4 --replicas=4,8 --rate=200mbit --mib=16

Build first: bazel build -c opt //services/weight_store:weight_store
//services/weight_store:refit_node //tools/health_check
"""

import argparse
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import cluster  # noqa: E402

PORT = 50053
METRICS_PORT = 9453
RELAY_PORT = 50060
STRATEGIES = {"store": "every one from the store", "chain": "relayed along a chain"}


def peak_resident_mib(pid):
    """VmHWM of a running process (namespaces share the machine's process table)."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Node:
    """A refit_node process, steered one line at a time."""

    def __init__(self, net, host, argv, env, log):
        self.host = host
        self.log = log
        self.process = net.spawn(host, argv, env=env, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)

    def send(self, line):
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def expect(self, word):
        line = self.process.stdout.readline().split()
        while line and line[0].startswith("["):  # A log line: to the nodes' log.
            self.log.write(f"{self.host}: {' '.join(line)}\n")
            line = self.process.stdout.readline().split()
        if not line or line[0] != word:
            raise RuntimeError(f"{self.host}: expected {word!r}, got {line!r} (see its log)")
        return line


def fetch_flags(net, strategy, index):
    """How replica `index` fetches under `strategy`."""
    if strategy == "store":
        return []
    flags = [f"--relay_port={RELAY_PORT}"]
    if index > 0:
        flags.append(f"--upstream={net.address(f'replica{index - 1}')}:{RELAY_PORT}")
    return flags


def run(args, replicas, strategy, env_extra, out):
    ranks = [f"rank{r}" for r in range(args.ranks)]
    readers = [f"replica{r}" for r in range(replicas)]
    before, start = cpu_seconds(), time.monotonic()
    with cluster.Cluster(["store", *ranks, *readers], rate=args.rate) as net:
        print(f"  hosts in network namespaces ({net.run_id}-*)", flush=True)
        env = dict(os.environ, UCX_NET_DEVICES="eth0", UCX_TLS="tcp", **env_extra)
        store_target = f"{net.address('store')}:{PORT}"
        data_dir = tempfile.mkdtemp(prefix="refit-store-")
        log = open(out / f"store-{strategy}-{replicas}.log", "w")
        store = net.spawn("store", [str(args.bin / "services/weight_store/weight_store"),
                            f"--host={net.address('store')}", f"--port={PORT}",
                            f"--metrics_port={METRICS_PORT}", f"--data_dir={data_dir}",
                            "--ucx_transports=tcp"], env=env, stdout=log, stderr=log)
        ready = net.run(ranks[0], [str(args.bin / "tools/health_check/health_check"),
                                   f"--target={store_target}",
                                   "--service=tandem.weightstore.v1.WeightStoreService",
                                   "--wait=60s"], capture_output=True, text=True)
        if ready.returncode != 0:
            raise RuntimeError(f"the store did not start: {ready.stdout}{ready.stderr}")
        node = str(args.bin / "services/weight_store/refit_node")
        common = [f"--store={store_target}", f"--mib={args.mib}", "--ucx_transports=tcp"]
        node_log = open(out / f"nodes-{strategy}-{replicas}.log", "w")
        fetchers = [Node(net, host, [node, "--mode=fetch", f"--versions={args.versions}",
                                     *fetch_flags(net, strategy, index), *common], env, node_log)
                    for index, host in enumerate(readers)]
        for fetcher in fetchers:
            fetcher.expect("watching")
        publishers = [Node(net, host, [node, "--mode=publish", f"--ranks={args.ranks}",
                                       f"--rank={r}", *common], env, node_log)
                      for r, host in enumerate(ranks)]
        rows = []
        for version in range(1, args.versions + 1):
            began = time.monotonic()
            for publisher in publishers:
                publisher.send(f"begin {version}")
            for publisher in publishers:
                publisher.expect("put")
            put = time.monotonic()
            publishers[0].send(f"commit {version}")
            fetched_bytes, relayed = 0, 0
            for fetcher in fetchers:
                _, _, size, source = fetcher.expect("fetched")
                fetched_bytes, relayed = int(size), relayed + (source == "relay")
            refit = time.monotonic() - put
            publishers[0].expect("committed")
            rows.append((put - began, refit, fetched_bytes, relayed))
        for node in publishers + fetchers:  # Relays serve until then.
            node.process.stdin.close()
        for node in publishers + fetchers:
            node.process.wait(timeout=60)
        store_peak_mib = peak_resident_mib(store.pid)
        elapsed = time.monotonic() - start
    used = cpu_seconds() - before
    return rows, used, elapsed, store_peak_mib


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", type=pathlib.Path, default=pathlib.Path("bazel-bin"))
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--replicas", default="4,8", help="comma-separated replica counts")
    parser.add_argument("--strategies", default="store,chain",
                        help=f"comma-separated, of {sorted(STRATEGIES)}")
    parser.add_argument("--rate", default="200mbit", help="every link's rate")
    parser.add_argument("--mib", type=float, default=16, help="approximate adapter size")
    parser.add_argument("--versions", type=int, default=4, help="versions (the first a warm-up)")
    parser.add_argument("--ucx_env", default="",
                        help="extra UCX variables, e.g. UCX_TCP_TX_SEG_SIZE=64k,"
                             "UCX_TCP_RX_SEG_SIZE=256k")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("/tmp/refit-bench"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env_extra = dict(item.split("=", 1) for item in args.ucx_env.split(",") if item)
    rate_bytes = cluster.parse_rate(args.rate) / 8
    cores = os.cpu_count()
    print(f"{args.ranks} ranks, rate {args.rate} per link, {args.mib} MiB adapter, "
          f"UCX env {env_extra or 'default'}")
    for replicas in [int(n) for n in args.replicas.split(",")]:
        for strategy in args.strategies.split(","):
            rows, used, elapsed, store_peak_mib = run(args, replicas, strategy, env_extra,
                                                      args.out)
            timed = rows[1:] or rows
            bound = timed[0][2] / rate_bytes
            refits = [row[1] for row in timed]
            uploads = [row[0] for row in timed]
            relayed = sum(row[3] for row in timed)
            print(f"  {replicas} replicas, {STRATEGIES[strategy]}: refit "
                  f"{min(refits):.3f}-{max(refits):.3f} s = {min(refits) / bound:.2f}-"
                  f"{max(refits) / bound:.2f}x the bound {bound:.3f} s (V = {timed[0][2]} bytes, "
                  f"{relayed} of {replicas * len(timed)} fetches relayed); "
                  f"upload {min(uploads):.3f}-{max(uploads):.3f} s; CPU "
                  f"{100 * used / (elapsed * cores):.0f}% of {cores} cores over {elapsed:.1f} s; "
                  f"store peak memory {store_peak_mib:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
