#!/usr/bin/env python3
"""Checks every edge of a `bazel query --output=graph` dependency graph against the layers.

Usage: check_layers.py GRAPH_FILE. Prints each violating edge with the rule it breaks; exit
status 1 if there is any, and also if the graph is implausibly small (a broken query).
"""
import re
import sys

EDGE = re.compile(r'"([^"]+)"\s*->\s*"([^"]+)"')
LOWER_LAYERS = ("engine", "kernels", "common", "transfer")


def package(label):
    return label.lstrip("/").split(":")[0]


def service_of(pkg):
    """('rollout', True) for services/rollout/client/...; (None, False) outside services."""
    parts = pkg.split("/")
    if len(parts) < 2 or parts[0] != "services":
        return None, False
    return parts[1], len(parts) > 2 and parts[2] == "client"


def violation(source, target):
    src, dst = package(source), package(target)
    src_service, src_client = service_of(src)
    dst_service, dst_client = service_of(dst)
    top = src.split("/")[0]
    if dst_service is not None and top in LOWER_LAYERS:
        return f"{top}/ must not depend on a service"
    if dst_service is not None and not dst_client:
        if src_service != dst_service:
            return f"outside services/{dst_service}, only its client/ may be used"
        if src_client:
            return f"services/{dst_service}/client must not reach its own server"
    if dst.split("/")[0] == "engine" and top in ("kernels", "common"):
        return f"{top}/ must not depend on the engine"
    return None


def main():
    edges = []
    with open(sys.argv[1]) as graph:
        for line in graph:
            for match in EDGE.finditer(line):
                # Factored graphs put several labels in one node, separated by newlines.
                for source in match.group(1).split("\\n"):
                    for target in match.group(2).split("\\n"):
                        edges.append((source, target))
    if len(edges) < 50:
        print(f"only {len(edges)} edges in the graph: the query is broken")
        return 1
    bad = [(s, t, why) for s, t in edges if (why := violation(s, t))]
    for source, target, why in bad:
        print(f"{source} -> {target}: {why}")
    print(f"{len(edges)} edges checked, {len(bad)} break a layer")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
