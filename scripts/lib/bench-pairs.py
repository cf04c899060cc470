"""Paired ratios of two sluice-bench builds run alternately (see scripts/bench-compare).

Reads <runs>/<name>-<round>.jsonl for both builds and prints, per scenario and metric, each
build's median and the quartiles of the per-round ratios this/other.
"""

import json
import statistics
import sys
from pathlib import Path

# The numbers compared, and whether more is better.
METRICS = [
    ("msgs_per_s", True),
    ("ratio_to_ceiling", True),
    ("x_host_us_per_msg", False),
    ("lateness_p99_ms", False),
]


def load(path: Path) -> dict:
    reports = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            report = json.loads(line)
            reports[report["scenario"]] = report
    return reports


def quartiles(values: list) -> tuple:
    if len(values) < 2:
        return (values[0], values[0], values[0])
    q = statistics.quantiles(values, n=4, method="inclusive")
    return (q[0], statistics.median(values), q[2])


def main() -> None:
    runs, this, other, rounds = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    pairs = [
        (load(runs / f"{this}-{r}.jsonl"), load(runs / f"{other}-{r}.jsonl"))
        for r in range(1, rounds + 1)
    ]
    scenarios = [s for s in pairs[0][0] if all(s in a and s in b for a, b in pairs)]
    print(f"{this} against {other}, {rounds} alternated rounds (ratio = this / other)")
    print(
        f"{'scenario':<18} {'metric':<18} {'this (median)':>14} {'other (median)':>15}"
        f" {'ratio q1':>9} {'median':>7} {'q3':>6}  verdict"
    )
    for scenario in scenarios:
        for metric, more_is_better in METRICS:
            a = [p[0][scenario].get(metric) for p in pairs]
            b = [p[1][scenario].get(metric) for p in pairs]
            if any(v is None for v in a + b) or any(v == 0 for v in b):
                continue
            ratios = [x / y for x, y in zip(a, b)]
            q1, med, q3 = quartiles(ratios)
            better = (q1 > 1.0) if more_is_better else (q3 < 1.0)
            worse = (q3 < 1.0) if more_is_better else (q1 > 1.0)
            verdict = "better" if better else "worse" if worse else "within noise"
            print(
                f"{scenario:<18} {metric:<18} {statistics.median(a):>14.2f}"
                f" {statistics.median(b):>15.2f} {q1:>9.3f} {med:>7.3f} {q3:>6.3f}  {verdict}"
            )


if __name__ == "__main__":
    main()
