#!/usr/bin/env python3
"""The cluster harness on this machine's real namespaces, veth links, bridge and tc: hosts reach
each other only through their shaped links, nothing of a run outlives it, and a killed run's
leftovers are removed by `cleanup`."""

import os
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

# Receives one connection on port 5000 and prints how many bytes it read.
SERVER = """
import socket
listener = socket.create_server(("0.0.0.0", 5000))
connection, _ = listener.accept()
total = 0
while chunk := connection.recv(1 << 16):
    total += len(chunk)
print(total)
"""

# Sends N bytes to ADDRESS:5000, retrying the connection until the server listens; prints seconds.
CLIENT = """
import socket, sys, time
address, size = sys.argv[1], int(sys.argv[2])
for _ in range(200):
    try:
        connection = socket.create_connection((address, 5000), timeout=5)
        break
    except OSError:
        time.sleep(0.05)
start = time.monotonic()
connection.sendall(b"x" * size)
connection.shutdown(socket.SHUT_WR)
connection.recv(1)
print(time.monotonic() - start)
"""


def own_namespaces():
    return cluster.run_namespaces().get(os.getpid(), [])


class ClusterTest(unittest.TestCase):
    def test_hosts_talk_over_their_shaped_links_only(self):
        rate = 40 * 10**6  # bits per second
        size = 4 * 10**6  # 0.8 s at the rate
        with cluster.Cluster(["rank0", "rank1"], rate=rate) as hosts:
            self.assertEqual(len(own_namespaces()), 3)  # Two hosts and the switch.
            server = hosts.spawn("rank0", [sys.executable, "-c", SERVER],
                                 stdout=subprocess.PIPE, text=True)
            sent = hosts.run("rank1", [sys.executable, "-c", CLIENT, hosts.address("rank0"),
                                       str(size)], capture_output=True, text=True, check=True)
            received, _ = server.communicate(timeout=60)
            self.assertEqual(int(received), size)
            seconds = float(sent.stdout)
            rate_seen = size * 8 / seconds
            print(f"{size} bytes in {seconds:.2f} s: {rate_seen / 1e6:.1f} Mbit/s "
                  f"on a {rate / 1e6:.0f} Mbit/s link")
            # The shaping holds (tbf lets one burst through above the rate).
            self.assertLess(rate_seen, 1.3 * rate)
            self.assertGreater(hosts.link_bytes("rank1")["tx"], size)
            self.assertGreater(hosts.link_bytes("rank0")["rx"], size)
            # Addresses exist only inside the run's namespaces: the machine has none of them.
            machine = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
            self.assertNotIn(cluster.SUBNET, machine)
        self.assertEqual(own_namespaces(), [])

    def test_an_error_while_building_removes_what_was_made(self):
        with self.assertRaises(ValueError):
            cluster.Cluster(["a", "a"])
        with self.assertRaises(ValueError):
            cluster.Cluster(["Bad Name"])
        self.assertEqual(own_namespaces(), [])

    def test_a_killed_run_leaves_namespaces_that_cleanup_removes(self):
        script = ("import sys, time; sys.path.insert(0, %r); import cluster; "
                  "c = cluster.Cluster(['a', 'b']); print('up', flush=True); time.sleep(60)"
                  % os.path.dirname(os.path.abspath(__file__)))
        run = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        self.assertEqual(run.stdout.readline().strip(), "up")
        self.assertEqual(len(cluster.run_namespaces().get(run.pid, [])), 3)
        run.send_signal(signal.SIGKILL)  # No handler runs: its namespaces stay.
        run.wait()
        run.stdout.close()
        self.assertEqual(len(cluster.run_namespaces().get(run.pid, [])), 3)
        removed = cluster.cleanup()
        self.assertEqual(len([name for name in removed if name.startswith(f"tdm{run.pid}-")]), 3)
        self.assertNotIn(run.pid, cluster.run_namespaces())

    def test_a_terminated_run_removes_its_namespaces_itself(self):
        script = ("import sys, time; sys.path.insert(0, %r); import cluster; "
                  "c = cluster.Cluster(['a']); print('up', flush=True); time.sleep(60)"
                  % os.path.dirname(os.path.abspath(__file__)))
        run = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        self.assertEqual(run.stdout.readline().strip(), "up")
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)
        run.stdout.close()
        deadline = time.monotonic() + 10
        while run.pid in cluster.run_namespaces() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertNotIn(run.pid, cluster.run_namespaces())


if __name__ == "__main__":
    unittest.main()
