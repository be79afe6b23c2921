#!/usr/bin/env python3
"""Every metric the Grafana dashboard and the Prometheus rules query exists in a running
instance's /metrics, with every label they group or match by.

    scripts/check-metrics-queries.py METRICS_FILE docker/grafana/dashboards/*.json docker/prometheus/rules.yml
"""
import json
import re
import sys

import yaml

# Functions, keywords and label names that look like identifiers in PromQL but are no metric.
NOT_METRICS = {
    "sum", "min", "max", "avg", "rate", "irate", "increase", "histogram_quantile", "by",
    "without", "on", "ignoring", "le", "and", "or", "unless", "count", "bool", "offset",
}
# A label value may hold braces (a route template): the labels run to the last `}`.
SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+\S+$")


def exported(metrics_text):
    """metric name -> label names seen, from the Prometheus text format."""
    families = {}
    for line in metrics_text.splitlines():
        match = SERIES.match(line)
        if not match or line.startswith("#"):
            continue
        labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', match.group(3) or ""))
        families.setdefault(match.group(1), set()).update(labels)
    return families


def queried(expr):
    """(metric, labels used with it) for each metric an expression names."""
    found = []
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    grouping = set()
    for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", without_strings):
        grouping.update(label.strip() for label in clause.split(",") if label.strip())
    for match in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{([^}]*)\})?", without_strings):
        name = match.group(1)
        if name in NOT_METRICS or name in grouping or not name.startswith(("rebate_", "up")):
            continue
        matchers = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", match.group(3) or ""))
        found.append((name, matchers, grouping))
    return found


def expressions(path):
    if path.endswith(".json"):
        with open(path) as file:
            dashboard = json.load(file)
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                yield f'{path}: panel "{panel["title"]}"', target["expr"]
    else:
        with open(path) as file:
            rules = yaml.safe_load(file)
        for group in rules["groups"]:
            for rule in group["rules"]:
                yield f'{path}: {rule.get("alert") or rule.get("record")}', rule["expr"]


def main():
    with open(sys.argv[1]) as file:
        families = exported(file.read())
    # Prometheus adds these for every target.
    families["up"] = {"job", "instance"}
    problems, checked = [], 0
    for path in sys.argv[2:]:
        for where, expr in expressions(path):
            for name, matchers, grouping in queried(expr):
                checked += 1
                if name not in families:
                    problems.append(f"{where}: {name} is not in /metrics")
                    continue
                # Every series also carries the labels Prometheus adds at scrape time.
                known = families[name] | {"instance", "job", "le"}
                for label in sorted((matchers | grouping) - known):
                    problems.append(f"{where}: {name} has no label {label}")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"metrics queries: {checked} metric references, all in /metrics with their labels")


if __name__ == "__main__":
    main()
