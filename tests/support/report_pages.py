"""A report as build_report writes one, made up for report.html's tests (any names, hostile ones too)."""

from __future__ import annotations


def made_up_report(ids: list[str]) -> dict[str, object]:
    """A two-round report of these members, as build_report writes one."""
    keys = ("fedsv", "fedsv_normalized", "fedsv_completed", "fedsv_shrunk", "loo", "loo_normalized")
    values = {pid: 0.01 * (k + 1) for k, pid in enumerate(ids)}
    rounds = [
        {
            "round": t, "selected": ids, "received": ids[1:],
            "absent": {ids[0]: "null_update" if t == 1 else "quarantined"},
            "effects": {ids[0]: {"effect": 0.25, "stderr": 0.01}} if t == 2 else {},
            "values": {pid: values[pid] for pid in ids[1:]}, "status": "valued",
            "test_accuracy": 0.5 + 0.1 * t,
        }
        for t in (1, 2)
    ]  # fmt: skip
    return {
        "run_id": "run-<b>x</b>",
        "config": {"participants": len(ids), "model": "<script>alert(1)</script>"},
        "rounds": rounds,
        "recommended": "fedsv_shrunk",
        "totals": {key: dict(values) for key in keys},
        "stderr": {key: dict.fromkeys(ids, 0.001) for key in keys},
        "stderr_between": {key: dict.fromkeys(ids, 0.001) for key in keys},
        "pending_rounds": [],
        "verdict": {"line": "verdict: <i>x</i>", "groups": [ids]},
        "classes": {"labels": 2, "totals": {pid: [0.01, -0.01] for pid in ids}},
        "final_accuracy": 0.7,
        "summary": {"participants": ids, "bytes_per_round": 1e6, "bytes_ratio_to_minimum": 1.0},
    }
