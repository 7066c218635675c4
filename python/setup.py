"""Generates the gRPC stubs of Tandem's public API while the package builds.

The messages and stubs come from the repository's protos (../proto) and the googleapis protos
they import (../third_party/googleapis), compiled with Debian's protoc and grpc_python_plugin
into the build directory, so the installed package carries code that matches the protos it was
built from. Only the public packages are compiled; tandem.internal.v1 is the services' own.
"""

import pathlib
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent / "proto"
GOOGLEAPIS_ROOT = HERE.parent / "third_party" / "googleapis"
PUBLIC_PACKAGES = ["type", "trainer", "rollout", "weightstore", "routerreplay"]
GOOGLEAPIS_FILES = ["google/api/field_behavior.proto", "google/rpc/status.proto",
                    "google/rpc/error_details.proto"]


def tool(name):
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} not found: install Debian's protobuf-compiler-grpc")
    return path


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        out = pathlib.Path(self.build_lib)
        protos = [str(p.relative_to(PROTO_ROOT)) for package in PUBLIC_PACKAGES
                  for p in sorted((PROTO_ROOT / "tandem" / package / "v1").glob("*.proto"))]
        command = [tool("protoc"), f"--proto_path={PROTO_ROOT}", f"--proto_path={GOOGLEAPIS_ROOT}",
                   f"--python_out={out}", f"--grpc_python_out={out}",
                   f"--plugin=protoc-gen-grpc_python={tool('grpc_python_plugin')}",
                   *protos, *GOOGLEAPIS_FILES]
        subprocess.run(command, check=True)


setup(cmdclass={"build_py": BuildWithStubs})
