#!/usr/bin/env python3
"""Checks every edge of a `bazel query --output=graph` dependency graph against the layers.

Usage: check_layers.py GRAPH_FILE. Prints each violating edge with the rule it breaks; exit
status 1 if there is any, and also if the graph is implausibly small (a broken query).
"""
import re
import sys

EDGE = re.compile(r'"([^"]+)"\s*->\s*"([^"]+)"')
LOWER_LAYERS = ("engine", "kernels", "common", "transfer", "placement")

# The trainer's update in layers (docs/contributing.md): the RL objective knows neither the
# communicator nor the optimizer step, and gradient synchronization and the optimizer step know
# no loss. Checked on everything a target reaches, not only its direct deps.
TRAINER = "//services/trainer:"
OBJECTIVE = (TRAINER + "rl_math", TRAINER + "value_head")
SYNC_AND_STEP = (TRAINER + "gradient_sync", TRAINER + "optimizer_step")
UNREACHABLE = {
    **{target: ("//common:communicator",) + SYNC_AND_STEP for target in OBJECTIVE},
    **{target: OBJECTIVE + (TRAINER + "policy_update",) for target in SYNC_AND_STEP},
}

# The model graph and the operations' interface choose no backend (docs/engine.md): none of them
# uses a backend's kernels directly, only the types all backends share (//kernels:types).
GRAPH = ("//engine:transformer", "//engine:model_ops", "//engine:bound_weights")
BACKEND_KERNELS = ("//kernels/cpu", "//kernels/cuda")


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
    if src_service is not None and dst.split("/")[0] == "kernels":
        return "services/ must not use kernels/: the engine's operations compute for them"
    if source in GRAPH and target.startswith(BACKEND_KERNELS):
        return "the model graph must not use a backend's kernels (the caller picks the backend)"
    return None


def reachable(edges, source):
    """Every label `source` depends on, directly or not."""
    targets = {}
    for s, t in edges:
        targets.setdefault(s, []).append(t)
    seen, stack = set(), [source]
    while stack:
        for target in targets.get(stack.pop(), []):
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return seen


def unreachable_violations(edges):
    found = []
    for source, forbidden in UNREACHABLE.items():
        if not any(s == source for s, _ in edges):
            found.append((source, "(graph)", "is not in the shipped graph: a renamed target?"))
            continue
        reached = reachable(edges, source)
        found += [(source, target, "a layer of the trainer's update reaches one it must not")
                  for target in forbidden if target in reached]
    return found


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
    bad += unreachable_violations(edges)
    for source, target, why in bad:
        print(f"{source} -> {target}: {why}")
    print(f"{len(edges)} edges checked, {len(bad)} break a layer")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
