#!/usr/bin/env python3
"""Counts test cases in the JUnit XML files Bazel wrote for the given test targets.

Usage: test_summary.py --testlogs=DIR [--testlogs=DIR...] LABEL... Each label's results are
taken from the first testlogs directory that has them (fuzz targets live in an output base of
their own). Prints one line per target (PASSED, FAILED, or
SKIPPED when every case skipped: a CUDA test without a GPU is not a pass), the failed and
skipped cases, the summed test time, then, as the last line, "N passed, N failed". A target
that crashed before writing its own cases counts as one failed case. Exit status 1 when
anything failed or a target has no result.
"""
import os
import sys
import xml.etree.ElementTree as ElementTree


def target_xml(testlogs_dirs, label):
    package, name = label.lstrip("/").split(":")
    paths = [os.path.join(d, package, name, "test.xml") for d in testlogs_dirs]
    return next((p for p in paths if os.path.exists(p)), paths[0])


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


def seconds_of(path):
    """The target's run time as its XML records it: gtest's testsuites element, or for tests
    Bazel wrote the XML of (shell tests such as the fuzz targets) its one testcase."""
    root = ElementTree.parse(path).getroot()
    element = root if root.get("time") is not None else root.find(".//testcase")
    try:
        return float(element.get("time", "0")) if element is not None else 0.0
    except ValueError:
        return 0.0


def target_outcome(outcomes):
    if "failed" in outcomes or not outcomes:
        return "failed"
    return "skipped" if all(o == "skipped" for o in outcomes) else "passed"


def main():
    testlogs = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--testlogs=")]
    labels = [a for a in sys.argv[1:] if not a.startswith("--testlogs=")]
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    total_seconds = 0.0
    for label in labels:
        path = target_xml(testlogs, label)
        if not os.path.exists(path):
            print(f"FAILED {label}: no test result (did not build or run)")
            counts["failed"] += 1
            continue
        cases = list(cases_of(path))
        seconds = seconds_of(path)
        total_seconds += seconds
        print(f"{target_outcome([o for _, o in cases]).upper():7} {label} ({seconds:.1f} s)")
        for name, outcome in cases:
            counts[outcome] += 1
            if outcome != "passed":
                print(f"  {outcome.upper()} {name}")
    if counts["skipped"]:
        print(f"{counts['skipped']} skipped (CUDA tests without a GPU)")
    print(f"test time {total_seconds:.0f} s summed over targets")
    print(f"{counts['passed']} passed, {counts['failed']} failed")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
