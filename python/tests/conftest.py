"""The four services on loopback, started once for the whole session from the binaries Bazel
built (TANDEM_BINARIES: the directory that holds services/ and tools/, e.g. bazel-bin), with a
bearer token, tcp UCX on `lo` and stores in a temporary directory."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import secrets
import socket
import subprocess
import time
from typing import Dict, List

import grpc
import pytest

SERVICES = ["weight_store", "router_replay", "rollout", "trainer"]


def binary(path: str) -> str:
    root = os.environ.get("TANDEM_BINARIES")
    if not root:
        pytest.fail("set TANDEM_BINARIES to the directory of the built binaries (bazel-bin)")
    return str(pathlib.Path(root) / path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class Deployment:
    ports: Dict[str, int]
    token: str
    base_model: str
    workdir: pathlib.Path
    processes: List[subprocess.Popen] = dataclasses.field(default_factory=list)

    def address(self, service: str) -> str:
        return f"127.0.0.1:{self.ports[service]}"


def _flags(deployment: Deployment, service: str, token_file: pathlib.Path) -> List[str]:
    data = deployment.workdir / service
    common = ["--host=127.0.0.1", f"--port={deployment.ports[service]}",
              f"--metrics_port={free_port()}", f"--auth_token_file={token_file}"]
    stores = [f"--weight_store={deployment.address('weight_store')}",
              f"--router_replay={deployment.address('router_replay')}"]
    return common + {
        "weight_store": [f"--data_dir={data}", "--ucx_transports=tcp"],
        "router_replay": [f"--data_dir={data}"],
        "rollout": [f"--base_model={deployment.base_model}", "--ucx_transports=tcp", *stores],
        "trainer": [f"--data_dir={data}", "--ucx_transports=tcp",
                    f"--rollout={deployment.address('rollout')}", *stores],
    }[service]


def _await_listening(address: str, process: subprocess.Popen, log: pathlib.Path) -> None:
    with grpc.insecure_channel(address) as channel:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"{log.stem} exited at start:\n{log.read_text()[-3000:]}")
            try:
                grpc.channel_ready_future(channel).result(timeout=0.5)
                return
            except grpc.FutureTimeoutError:
                continue
    pytest.fail(f"{log.stem} did not listen on {address} within 30 s")


@pytest.fixture(scope="session")
def deployment(tmp_path_factory) -> Deployment:
    workdir = tmp_path_factory.mktemp("tandem")
    base_model = workdir / "base_model.safetensors"
    subprocess.run([binary("engine/make_base_model"), "--digits=1", "--max_steps=60",
                    f"--out={base_model}"], check=True, stdout=subprocess.DEVNULL)
    token_file = workdir / "auth_token"
    token = secrets.token_urlsafe(24)
    token_file.write_text(token)
    token_file.chmod(0o600)
    deployment = Deployment({s: free_port() for s in SERVICES}, token, str(base_model), workdir)
    env = dict(os.environ, UCX_NET_DEVICES="lo")
    try:
        for service in SERVICES:
            log = workdir / f"{service}.log"
            process = subprocess.Popen(
                [binary(f"services/{service}/{service}"), *_flags(deployment, service, token_file)],
                stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
            deployment.processes.append(process)
            _await_listening(deployment.address(service), process, log)
        yield deployment
    finally:
        for process in reversed(deployment.processes):
            process.terminate()
        for process in deployment.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
