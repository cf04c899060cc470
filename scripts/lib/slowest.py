"""Print what a nextest run's JUnit report says: how many tests ran (by binary), and the 15
slowest, so each run shows where its minutes went. Usage: slowest.py <junit.xml>"""

import sys
import xml.etree.ElementTree as ET
from collections import Counter

try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError) as err:
    print(f"tests: no JUnit report to read ({err})", file=sys.stderr)
    sys.exit(0)
cases = []
for suite in root.iter("testsuite"):
    for case in suite.iter("testcase"):
        if case.find("skipped") is None:
            cases.append((float(case.get("time", 0)), suite.get("name", "?"), case.get("name", "?")))
per_binary = Counter(binary for _, binary, _ in cases)
out = sys.stderr
print(f"tests run: {len(cases)} ({', '.join(f'{b} {n}' for b, n in sorted(per_binary.items()))})", file=out)
print("slowest tests:", file=out)
for took, binary, name in sorted(cases, reverse=True)[:15]:
    print(f"  {took:7.1f} s  {binary} {name}", file=out)
