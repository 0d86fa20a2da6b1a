#!/usr/bin/env python3
"""Which tests a run takes, and what they cost.

    tier.py filter submission|full   the nextest filterset of that tier (stdout), and on stderr
                                     which full-tier tests it pulls in and why
    tier.py report JUNIT TIER        the 15 slowest tests, the run's wall time against the tier's
                                     budget, and the tests that grew against .ci/test-times.tsv;
                                     exits 1 when the per-submission tier is over its budget
    tier.py baseline JUNIT           rewrites .ci/test-times.tsv from a full run's JUnit

The per-submission tier (what .ci/run runs on every submission) is every test except the ones
.ci/tiers.toml lists as full-tier, plus:
  - a rotating slice of the full tier: its tests dealt into `slices` piles of about equal time
    (see `deal`), pile
    (number of commits on main) mod `slices`: every full-tier test runs at least every `slices`
    submissions;
  - the full-tier tests of every area whose paths the submission changed (the commits of the
    last 4 hours, as the before-stop hook counts a change; QDB_CI_CHANGED_SINCE=REV overrides).
"""

import os
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIERS = ROOT / ".ci" / "tiers.toml"
TIMES = ROOT / ".ci" / "test-times.tsv"


def load():
    with open(TIERS, "rb") as f:
        return tomllib.load(f)


def full_tier(config):
    """(binary, test) -> area, for every test listed as full-tier."""
    tests = {}
    for area in config["area"]:
        for entry in area.get("full", []):
            binary, test = entry["test"].split(" ", 1)
            tests[(binary, test)] = area["name"]
    return tests


def git(*args):
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()


def changed_paths():
    base = os.environ.get("QDB_CI_CHANGED_SINCE") or git(
        "rev-list", "-1", "--before=4 hours ago", "HEAD"
    )
    if not base:
        # Every commit is new: the whole tree is the change.
        return None
    return [p for p in git("diff", "--name-only", base, "HEAD").splitlines() if p]


def matches(path, patterns):
    return any(path == p or path.startswith(p) for p in patterns)


def nextest_test(binary, test):
    return f"(binary(={binary}) & test(={test}))"


def deal(full, slices):
    """(binary, test) -> pile: the full-tier tests dealt into `slices` piles of about equal
    time (longest first, each to the lightest pile, times from .ci/test-times.tsv, ties by
    name), so no submission's slice is much heavier than another's: dealt by name, one pile
    held the 409 s force-detach test and 1,253 test-seconds where another held 696."""
    times = read_times()
    ordered = sorted(full, key=lambda k: (-times.get(k, 0.0), k))
    sums = [0.0] * slices
    piles = {}
    for key in ordered:
        lightest = min(range(slices), key=lambda i: (sums[i], i))
        piles[key] = lightest
        sums[lightest] += times.get(key, 0.0)
    return piles


def selection(config):
    """The full-tier tests this submission takes: (binary, test) -> why (a rotating slice, or
    its area changed)."""
    full = full_tier(config)
    slices = int(config["slices"])
    commits = int(git("rev-list", "--count", "HEAD") or "0")
    pile = commits % slices
    pulled = {}
    for key, dealt in deal(full, slices).items():
        if dealt == pile:
            pulled[key] = f"rotating slice {pile + 1} of {slices}"
    paths = changed_paths()
    for area in config["area"]:
        hits = (
            ["(every path: no base to compare with)"]
            if paths is None
            else [p for p in paths if matches(p, area.get("paths", []))]
        )
        if hits:
            for key, name in full.items():
                if name == area["name"]:
                    pulled.setdefault(key, f"area {name} changed ({hits[0]})")
    return full, pulled


def filter_for(tier):
    if tier == "full":
        return "all()", []
    full, pulled = selection(load())
    excluded = [nextest_test(b, t) for (b, t) in sorted(full) if (b, t) not in pulled]
    expr = "all()" if not excluded else "not (" + " | ".join(excluded) + ")"
    notes = [f"{b} {t}: {why}" for (b, t), why in sorted(pulled.items())]
    return expr, notes


def read_junit(path):
    """[(binary, test, seconds, outcome)] and the run's wall time."""
    root = ET.parse(path).getroot()
    cases = []
    for suite in root.iter("testsuite"):
        binary = suite.get("name", "").split("::")[-1]
        for case in suite.iter("testcase"):
            outcome = "passed"
            if case.find("failure") is not None or case.find("error") is not None:
                outcome = "failed"
            elif case.find("skipped") is not None:
                outcome = "skipped"
            cases.append((binary, case.get("name"), float(case.get("time", 0)), outcome))
    return cases, float(root.get("time", 0))


def read_times():
    times = {}
    if TIMES.exists():
        for line in TIMES.read_text().splitlines():
            if line and not line.startswith("#"):
                binary, test, seconds = line.split("\t")[:3]
                times[(binary, test)] = float(seconds)
    return times


def report(junit, tier):
    config = load()
    cases, wall = read_junit(junit)
    ran = [c for c in cases if c[3] != "skipped"]
    print(f"tests: {len(ran)} run in {wall:.0f} s wall ({tier} tier)")
    print("the 15 slowest:")
    for binary, test, seconds, outcome in sorted(ran, key=lambda c: -c[2])[:15]:
        print(f"  {seconds:7.1f} s  {binary} {test}{'' if outcome == 'passed' else '  ' + outcome.upper()}")
    before = read_times()
    grew = [
        (b, t, s, before[(b, t)])
        for b, t, s, _ in ran
        if (b, t) in before and s > before[(b, t)] * 1.5 + 15
    ]
    new = [(b, t, s) for b, t, s, _ in ran if (b, t) not in before and s > 60]
    for b, t, s, was in sorted(grew, key=lambda g: g[3] - g[2]):
        print(f"grew: {b} {t}: {s:.0f} s, {was:.0f} s in .ci/test-times.tsv")
    for b, t, s in new:
        print(f"new and slow: {b} {t}: {s:.0f} s (not in .ci/test-times.tsv)")
    if tier == "full":
        listed = full_tier(config)
        names = {(b, t) for b, t, _, _ in cases}
        for b, t in sorted(set(listed) - names):
            print(f"stale: .ci/tiers.toml lists {b} {t}, which no longer exists")
        return 0
    if tier != "submission":
        return 0
    # The tier's own tests, without those pulled in because their area changed: a change to
    # failover code runs every failover test, and that is not the tier growing.
    _, pulled = selection(config)
    by_area = {k for k, why in pulled.items() if why.startswith("area ")}
    own = sum(s for b, t, s, _ in ran if (b, t) not in by_area)
    pulled_seconds = sum(s for b, t, s, _ in ran if (b, t) in by_area)
    budget = float(config["budget"]["submission_test_seconds"])
    print(
        f"the tier's own tests: {own:.0f} test-seconds (budget {budget:.0f}); pulled in by the "
        f"areas changed: {pulled_seconds:.0f} test-seconds"
    )
    if own > budget:
        print(
            f"FAIL: the per-submission tier's tests took {own:.0f} test-seconds, over their "
            f"budget of {budget:.0f} (.ci/tiers.toml): move a slow test to the full tier "
            "(listing it in an area) or make it faster; the lines above name the tests that grew"
        )
        return 1
    return 0


def baseline(junit):
    cases, wall = read_junit(junit)
    full = full_tier(load())
    lines = [
        "# Each test's wall time in a full run (.ci/full: six at once on the 2-core machine),",
        "# seconds, and the tier that runs it.",
        "# Written by `python3 .ci/tier.py baseline JUNIT`; .ci/tier.py report names the tests",
        "# that grew past 1.5 x this + 15 s.",
    ]
    for binary, test, seconds, outcome in sorted(cases, key=lambda c: (c[0], c[1])):
        if outcome == "skipped":
            continue
        tier = "full" if (binary, test) in full else "submission"
        lines.append(f"{binary}\t{test}\t{seconds:.1f}\t{tier}")
    TIMES.write_text("\n".join(lines) + "\n")
    print(f"{TIMES}: {len(lines) - 4} tests, full run {wall:.0f} s wall")


def main(argv):
    if len(argv) == 3 and argv[1] == "filter" and argv[2] in ("submission", "full"):
        expr, notes = filter_for(argv[2])
        for n in notes:
            print(f"tier: pulled in {n}", file=sys.stderr)
        print(expr)
        return 0
    if len(argv) == 4 and argv[1] == "report":
        return report(argv[2], argv[3])
    if len(argv) == 3 and argv[1] == "baseline":
        baseline(argv[2])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
