#!/usr/bin/env python3
"""Counts test cases in the JUnit XML files Bazel wrote for the given test targets.

Usage: test_summary.py TESTLOGS_DIR LABEL... Prints failed and skipped cases, then, as
the last line, "N passed, N failed". A target that crashed before writing its own cases
counts as one failed case. Exit status 1 when anything failed or a target has no result.
"""
import os
import sys
import xml.etree.ElementTree as ElementTree


def target_xml(testlogs, label):
    package, name = label.lstrip("/").split(":")
    return os.path.join(testlogs, package, name, "test.xml")


def cases_of(path):
    """Yields (name, outcome) with outcome in passed, failed, skipped."""
    root = ElementTree.parse(path).getroot()
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}.{case.get('name', '')}".strip(".")
        if case.find("failure") is not None or case.find("error") is not None:
            yield name, "failed"
        elif case.find("skipped") is not None or case.get("result") == "skipped":
            yield name, "skipped"
        else:
            yield name, "passed"


def main():
    testlogs, labels = sys.argv[1], sys.argv[2:]
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for label in labels:
        path = target_xml(testlogs, label)
        if not os.path.exists(path):
            print(f"FAILED {label}: no test result (did not build or run)")
            counts["failed"] += 1
            continue
        for name, outcome in cases_of(path):
            counts[outcome] += 1
            if outcome != "passed":
                print(f"{outcome.upper()} {label} {name}")
    if counts["skipped"]:
        print(f"{counts['skipped']} skipped (CUDA tests without a GPU)")
    print(f"{counts['passed']} passed, {counts['failed']} failed")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
