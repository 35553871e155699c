"""The pre-screen's summary: every finished run's yardstick at N = 4, B = 4, by study-4 arm, cell and policy point;
the gate and the ranking the pre-registration (research/harness/training_study/preregistration4.py) fixes, marked
provisional while cells are missing.

    PYTHONPATH=. python research/estimator_study/prescreen/summary.py          # writes summary.json beside it
    PYTHONPATH=. python research/estimator_study/prescreen/summary.py --check  # exit 1 if summary.json differs

study4.py's gate reads summary.json. A run is in it once its JSON is here (run.sh makes them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUMMARY = HERE / "summary.json"
ARMS = {  # study-4 arm -> the variance tool's estimator
    "grpo_N4": "grpo_std",
    "grpo_unscaled_N4": "grpo",
    "otb_default": "otb_default",
    "otb_loo_mean": "otb_others_mean_loo",
    "otb_loo_ess": "otb_others_mean_loo_ess",
    "ogb_N4": "ogb",
}
CELLS = {  # cell -> (init stem, trained stem, horizon): the pre-registered cells, run or not
    "ramble": ("prescreen_ramble_init_n4g400", "prescreen_ramble_trained_n4g400", None),
    "count256": ("prescreen_count_init", "prescreen_count_trained", "256"),
    "count512": ("prescreen_count_init", "prescreen_count_trained", "512"),
    "count1024": ("prescreen_count_init", "prescreen_count_trained", "1024"),
    "math64": ("prescreen_math_init", "prescreen_math_trained", "64"),
    "math256": ("prescreen_math_init", "prescreen_math_trained", "256"),
    "count_pool": ("prescreen_reach_init", "prescreen_reach_trained", "256"),
    "study-long_right": ("prescreen_long_right_init", "prescreen_long_right_trained", None),
    "study-copy": ("prescreen_copy_init", "prescreen_copy_trained", None),
}
KEYS = ("cos", "cos_ci", "scale", "snr", "eps_star", "eps_star_ci", "kappa")
CANDIDATES = ("otb_default", "otb_loo_mean", "otb_loo_ess", "ogb_N4")
UNBIASED = ("otb_loo_mean", "otb_loo_ess")


def _point(stem: str, horizon: str | None) -> dict | None:
    path = HERE / f"{stem}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    space = data["results"]["lm_head"]
    entry = space[horizon] if horizon else next(iter(space.values()))
    table, paired = entry["yardstick"]["table"], entry["yardstick"]["paired"]
    rows = {arm: {k: table[f"N=4/{est}"][k] for k in KEYS} for arm, est in ARMS.items() if f"N=4/{est}" in table}
    for arm, est in ARMS.items():  # raw MSE at one group (the variance table's, for prediction P1)
        if arm in rows and f"N=4/{est}" in entry.get("table", {}):
            rows[arm]["raw_mse"] = entry["table"][f"N=4/{est}"]["mse"]
    for arm, est in ARMS.items():  # eps_star minus unscaled GRPO's, on the same resamples
        pair = paired.get(f"N=4/{est}-grpo", {}).get("eps_star")
        if arm in rows and pair:
            rows[arm]["eps_star_minus_unscaled_grpo"] = {k: pair[k] for k in ("diff", "diff_ci", "significant")}
    return {"file": path.name, "command": data["meta"]["command"], "rows": rows}


def build() -> dict:
    cells, missing = {}, []
    for cell, (init, trained, horizon) in CELLS.items():
        points = {"init": _point(init, horizon), "trained": _point(trained, horizon)}
        for name, point in points.items():
            if point is None:
                missing.append(f"{cell}/{name}")
        if any(points.values()):
            cells[cell] = {name: point["rows"] for name, point in points.items() if point}
            cells[cell]["files"] = {name: point["file"] for name, point in points.items() if point}
    gate = {}
    for arm in CANDIDATES:
        cosines = [c[p][arm]["cos"] for c in cells.values() for p in ("init", "trained") if p in c and arm in c[p]]
        by_construction = arm in UNBIASED
        failed = any(x < 0.99 for x in cosines)  # final: a later cell cannot undo it
        gate[arm] = {
            "passes": True if by_construction else False if failed else None if missing or not cosines else True,
            "by_construction": by_construction,
            "min_cos": min(cosines) if cosines else None,
        }
    inits = [c["init"] for c in cells.values() if "init" in c]
    ranking = sorted(
        (a for a in CANDIDATES if gate[a]["passes"] and all(a in r for r in inits)),
        key=lambda a: sum(r[a]["eps_star"] for r in inits) / len(inits),
    )
    return {
        "meta": {
            "command": "PYTHONPATH=. python research/estimator_study/prescreen/summary.py",
            "N": 4,
            "batch_groups": 4,
            "arms": ARMS,
            "provisional": bool(missing),
            "missing": missing,
        },
        "cells": cells,
        "gate": gate,
        "ranking_by_mean_eps_star_at_init": ranking,
    }


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = json.dumps(build(), indent=1) + "\n"
    if "--check" in argv:
        same = SUMMARY.exists() and SUMMARY.read_text() == text
        print("summary.json is up to date" if same else "summary.json differs: run summary.py")
        return 0 if same else 1
    SUMMARY.write_text(text)
    print(f"wrote {SUMMARY}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
