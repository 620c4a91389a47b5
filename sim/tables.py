#!/usr/bin/python3
"""Markdown tables of EXPERIMENTS.md §6 and §7 from ubep-sim's JSON.

usage: sim/tables.py validate docs/sim/validate.json
       sim/tables.py sensitivity docs/sim/sensitivity.json
"""
import json
import sys


def validate(j):
    print("| case | algo | op | calibrated shape | measured µs (least disturbed round; largest) "
          "| predicted µs | error |")
    print("|---|---|---|---|---|---|---|")
    for r in j["rows"]:
        miss = "" if abs(r["error_pct"]) <= 25 else " ✗"
        print(f"| {r['case']} | {r['algo']} | {r['op']} | "
              f"{'yes' if r['used_for_calibration'] else 'no'} | {r['measured_us']:.0f} "
              f"({r['measured_max_us']:.0f}) | {r['predicted_us']:.0f} | {r['error_pct']:+.1f}%{miss} |")
    u, n = j["unseen_within_25pct"], j["unseen_cases"]
    print(f"\nunseen: {u} of {n} ({100 * u / n:.0f}%); calibrated: "
          f"{j['calibrated_within_25pct']} of {j['calibrated_cases']}")


def sensitivity(j):
    comps = [c["name"] for c in j["rows"][0]["comparisons"]]
    paper = [c["paper"] for c in j["rows"][0]["comparisons"]]
    base = [c["base_pct"] for c in j["rows"][0]["comparisons"]]
    print("| parameter: low .. high (preset) | " + " | ".join(comps) + " |")
    print("|---" * (len(comps) + 1) + "|")
    print("| paper | " + " | ".join(paper) + " |")
    print("| preset values | " + " | ".join(f"{b:+.1f}%" for b in base) + " |")
    for r in j["rows"]:
        cells = [f"{c['at_low_pct']:+.1f} .. {c['at_high_pct']:+.1f}%" for c in r["comparisons"]]
        print(f"| `{r['parameter']}`: {r['low']:g} .. {r['high']:g} ({r['base']:g}) | "
              + " | ".join(cells) + " |")
    print()
    for r in j["rows"]:
        print(f"* `{r['parameter']}` range: {r['why']}")


if __name__ == "__main__":
    {"validate": validate, "sensitivity": sensitivity}[sys.argv[1]](json.load(open(sys.argv[2])))
