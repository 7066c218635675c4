#!/usr/bin/env python3
"""A cluster on one machine: hosts in network namespaces joined by shaped links to a switch.

Every host is a network namespace of its own, with a veth link ("eth0") to a bridge that lives
in the switch's namespace; each link is shaped with tc tbf, both ways, to the chosen rate (netem
is not available on these kernels). Addresses (10.77.0.0/24) exist only inside namespaces this
run created: the machine's own interfaces and routes are never touched. Every namespace, and
with it every link, is removed on exit -- also after an error or SIGTERM/SIGINT -- and
`cluster.py cleanup` removes what a run killed by SIGKILL left behind.

    with Cluster(["rank0", "rank1"], rate="100mbit") as cluster:
        server = cluster.spawn("rank0", ["python3", "-m", "http.server", "8000"])
        cluster.run("rank1", ["curl", f"http://{cluster.address('rank0')}:8000/"])
        print(cluster.link_bytes("rank0"))
"""

import argparse
import atexit
import os
import re
import signal
import subprocess
import sys

PREFIX = "tdm"  # Namespaces are named tdm<pid>-<host>: the pid says which run made them.
SUBNET = "10.77.0"
SWITCH = "switch"
_NAME = re.compile(r"^[a-z][a-z0-9]{0,15}$")


def _command(argv, namespace=None, check=True):
    """Runs `argv` (in `namespace`, if one is named), returning its completed process."""
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    return subprocess.run(prefix + list(argv), check=check, capture_output=True, text=True)


def _ip(*args, namespace=None, check=True):
    return _command(["ip", *args], namespace, check)


def _tbf(device, namespace, rate_bits):
    # A burst of 10 ms at the rate (at least 32 KiB) keeps tbf accurate at high rates.
    burst = max(32 * 1024, rate_bits // 8 // 100)
    _command(["tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", str(rate_bits),
              "burst", str(burst), "latency", "100ms"], namespace)


def parse_rate(rate):
    """'100mbit', '1gbit', '500kbit' or bits per second -> bits per second."""
    match = re.fullmatch(r"(\d+)([kmg]?)bit", rate) if isinstance(rate, str) else None
    if match is None:
        return int(rate)
    return int(match.group(1)) * {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[match.group(2)]


class Cluster:
    """Hosts in network namespaces of their own, on one switch, every link shaped to `rate`
    (or to its own rate in `host_rates`, e.g. {"rollout": "10mbit"})."""

    def __init__(self, hosts, rate="1gbit", host_rates=None):
        if not hosts or len(hosts) > 250 or len(set(hosts)) != len(hosts):
            raise ValueError(f"hosts: 1..250 distinct names, got {hosts}")
        for host in hosts:
            if not _NAME.match(host) or host == SWITCH:
                raise ValueError(f"host name {host!r}: [a-z][a-z0-9]{{0,15}}, not {SWITCH!r}")
        self.hosts = list(hosts)
        self.rate_bits = parse_rate(rate)
        self.host_rate_bits = {host: parse_rate(r) for host, r in (host_rates or {}).items()}
        unknown = set(self.host_rate_bits) - set(self.hosts)
        if unknown:
            raise ValueError(f"host_rates names hosts not in the cluster: {sorted(unknown)}")
        self.run_id = f"{PREFIX}{os.getpid()}"
        self._made = []  # Namespaces created so far, removed by close().
        self._processes = []
        atexit.register(self.close)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def namespace(self, host):
        return f"{self.run_id}-{host}"

    def address(self, host):
        return f"{SUBNET}.{self.hosts.index(host) + 1}"

    def _add_namespace(self, name):
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("link", "set", "lo", "up", namespace=name)

    def _build(self):
        switch = self.namespace(SWITCH)
        self._add_namespace(switch)
        _ip("link", "add", "br0", "type", "bridge", namespace=switch)
        _ip("link", "set", "br0", "up", namespace=switch)
        for index, host in enumerate(self.hosts):
            namespace = self.namespace(host)
            self._add_namespace(namespace)
            port = f"port{index}"
            # Both ends are born inside namespaces of this run, never in the machine's own.
            _ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", namespace,
                namespace=switch)
            _ip("link", "set", port, "master", "br0", "up", namespace=switch)
            _ip("addr", "add", f"{self.address(host)}/24", "dev", "eth0", namespace=namespace)
            _ip("link", "set", "eth0", "up", namespace=namespace)
            rate_bits = self.host_rate_bits.get(host, self.rate_bits)
            _tbf("eth0", namespace, rate_bits)  # Host -> switch.
            _tbf(port, switch, rate_bits)  # Switch -> host.

    def spawn(self, host, argv, **popen_args):
        """Starts `argv` in `host`'s namespace; it is killed at close() if still running."""
        process = subprocess.Popen(["ip", "netns", "exec", self.namespace(host)] + list(argv),
                                   **popen_args)
        self._processes.append(process)
        return process

    def run(self, host, argv, **run_args):
        """Runs `argv` in `host`'s namespace to its end."""
        return subprocess.run(["ip", "netns", "exec", self.namespace(host)] + list(argv),
                              **run_args)

    def link_bytes(self, host):
        """Bytes `host` sent and received on its link: {'tx': n, 'rx': n}."""
        counts = {}
        for direction in ("tx", "rx"):
            path = f"/sys/class/net/eth0/statistics/{direction}_bytes"
            counts[direction] = int(self.run(host, ["cat", path], capture_output=True, text=True,
                                             check=True).stdout)
        return counts

    def close(self):
        """Stops the processes and removes every namespace (and so every link) this run made."""
        for process in self._processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        self._processes = []
        for name in reversed(self._made):
            remove_namespace(name)
        self._made = []

    def _on_signal(self, signum, _frame):
        self.close()
        sys.exit(128 + signum)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()


def remove_namespace(name):
    """Kills what still runs in namespace `name`, then removes it (its links go with it)."""
    pids = _ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    _ip("netns", "del", name, check=False)


def run_namespaces():
    """{pid: [namespace names]} of every run's namespaces on this machine."""
    runs = {}
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0]
        match = re.fullmatch(rf"{PREFIX}(\d+)-[a-z0-9]+", name)
        if match:
            runs.setdefault(int(match.group(1)), []).append(name)
    return runs


def cleanup():
    """Removes the namespaces of runs whose process is gone (killed before it could)."""
    removed = []
    for pid, names in run_namespaces().items():
        if os.path.exists(f"/proc/{pid}"):
            continue
        for name in names:
            remove_namespace(name)
            removed.append(name)
    return removed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("cleanup", help="remove namespaces that killed runs left behind")
    run = commands.add_parser("run", help="run COMMAND on the first host of a new cluster")
    run.add_argument("--hosts", default="host0,host1", help="comma-separated host names")
    run.add_argument("--rate", default="1gbit", help="every link's rate, e.g. 100mbit")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args()
    if args.command == "cleanup":
        for name in cleanup():
            print(f"removed {name}")
        return 0
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    hosts = args.hosts.split(",")
    with Cluster(hosts, rate=args.rate) as cluster:
        for host in hosts:
            print(f"{host}: {cluster.address(host)} in namespace {cluster.namespace(host)}",
                  flush=True)
        return cluster.run(hosts[0], argv).returncode if argv else 0


if __name__ == "__main__":
    sys.exit(main())
