"""Where the test command's time goes, from a junit report of one run.

    pytest --junitxml=/tmp/times.xml        # the README's test command, plus a report
    python tools/test_times.py /tmp/times.xml [--top 10]

Prints the seconds of every test file and notebook (a notebook's nbval items summed: its wall time under nbval,
beside whatever the other worker ran), the slowest items, and the total over all workers; with two workers the
wall time of the run is about half that total. Name the CPU beside the figures (`lscpu | grep "Model name"`, and
whether its flags hold avx512_bf16 or amx_bf16): the same suite takes very different times on different kinds.
"""
from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict


def times(path: str) -> tuple[dict[str, float], list[tuple[float, str]]]:
    """({file or notebook: seconds}, [(seconds, item)]) from a junit report."""
    per_file, items = defaultdict(float), []
    for case in ET.parse(path).getroot().iter("testcase"):
        seconds, where = float(case.get("time", 0)), case.get("classname", "")
        name = where.replace(".", "/", 1) if ".ipynb" in where else where.replace(".", "/") + ".py"
        per_file[name] += seconds
        items.append((seconds, f"{name}::{case.get('name')}"))
    return dict(per_file), sorted(items, reverse=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="a junit XML report (pytest --junitxml=PATH)")
    parser.add_argument("--top", type=int, default=10, help="how many of the slowest items to list")
    args = parser.parse_args(argv)
    per_file, items = times(args.report)
    total = sum(per_file.values())
    print(f"{total:.0f} s over all workers ({total / 60:.1f} min), {len(items)} items")
    for name, seconds in sorted(per_file.items(), key=lambda kv: -kv[1]):
        print(f"{seconds:8.1f} s  {name}")
    print(f"the {args.top} slowest items:")
    for seconds, item in items[: args.top]:
        print(f"{seconds:8.1f} s  {item}")


if __name__ == "__main__":
    main()
