#!/usr/bin/env python3
"""docs/deploy.md's table of chart values names every key of values.yaml, and only keys it has."""

import os
import pathlib
import re
import sys

import yaml

ROOT = (pathlib.Path(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"])
        if "TEST_SRCDIR" in os.environ else pathlib.Path(__file__).resolve().parents[4])
COMPONENTS = ["trainer", "rollout", "weightStore", "routerReplay"]


def leaf_paths(values, prefix=""):
    for key, value in values.items():
        path = prefix + key
        if isinstance(value, dict) and value:
            yield from leaf_paths(value, path + ".")
        else:
            yield path


def documented_paths(readme):
    section = readme.split("\n## Values\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {path for row in rows for path in re.findall(r"`([^`]+)`", row)}


def expanded(path):
    """A table path with `<component>.` stands for that key of every component."""
    if path.startswith("<component>."):
        return [component + path[len("<component>"):] for component in COMPONENTS]
    return [path]


def main():
    values = yaml.safe_load((ROOT / "deploy/helm/tandem/values.yaml").read_text())
    leaves = set(leaf_paths(values))
    table = {full for path in documented_paths((ROOT / "docs/deploy.md").read_text())
             for full in expanded(path)}
    keys = leaves | {".".join(leaf.split(".")[:n]) for leaf in leaves
                     for n in range(1, leaf.count(".") + 1)}
    unknown = sorted(table - keys)
    undocumented = sorted(leaf for leaf in leaves
                          if not any(leaf == path or leaf.startswith(path + ".") for path in table))
    problems = ([f"docs/deploy.md names {path}, which values.yaml does not have" for path in unknown] +
                [f"docs/deploy.md's values table does not cover {leaf}" for leaf in undocumented])
    if problems:
        sys.exit("\n".join(problems))
    print(f"values table covers all {len(leaves)} keys of values.yaml")


if __name__ == "__main__":
    main()
