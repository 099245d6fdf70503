"""report.html: a run's report as one self-contained page (Plotly charts, the payout, the guard's decisions).

Everything the page shows comes from report.json (`build_report`), so a run recorded by `fedsv launch`,
a study or the Flower wrapper gets the same page. Plotly's JavaScript is embedded (the page needs no
network when opened). Names come from the ledger, and a participant may have chosen its own: every
string reaches the page through `html.escape` (HTML) or `_script_json` (JSON inside <script>, with
<, > and & escaped), never as markup.
"""

from __future__ import annotations

import html
import json
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from fedsv.app.payout import FALLBACK, NEGATIVE, RULES, VALUES, improved
from fedsv.app.report import RECOMMENDED, ranked_rows
from fedsv.app.report_owners import owner_lines
from fedsv.valuation.accounting.verdict import Z95

SECTIONS = ("run", "verdict", "values", "cumulative", "labels", "payout", "guard", "members")
"""The page's sections, in order (each an element with this id)."""

SETTINGS = (
    "participants", "fraction", "rounds", "model", "dataset", "partition", "epochs", "valuation", "metric",
    "aggregation", "update_direction", "update_norm_policy", "seed",
)  # fmt: skip
"""The settings the page's header shows (report.json's `config` holds them all)."""


def _script_json(data: Any) -> str:
    """JSON safe inside a <script> element: no </script>, no <!--, whatever the strings hold."""
    text = json.dumps(data, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _figure(fig: go.Figure) -> Any:
    return json.loads(pio.to_json(fig, validate=False))


def _values_figure(report: dict[str, Any], rows: list[dict[str, Any]]) -> go.Figure:
    """Every member's values with their 95% intervals (dot and whisker), the recommended value first."""
    fig = go.Figure()
    names = [row["participant"] for row in rows]
    keys = [report.get("recommended", RECOMMENDED), "fedsv_completed", "fedsv"]
    for k, key in enumerate(dict.fromkeys(keys)):
        values = [row.get(key) for row in rows]
        errors = [Z95 * e if e is not None else None for e in (row.get(f"{key}_stderr") for row in rows)]
        fig.add_trace(
            go.Scatter(
                x=values,
                y=names,
                mode="markers",
                name=key + (" (recommended)" if k == 0 else ""),
                visible=True if k == 0 else "legendonly",
                error_x={"type": "data", "array": errors, "visible": True},
                hovertemplate="%{y}: %{x:.5f}<extra>" + key + "</extra>",
            )
        )
    height = max(300, 22 * len(names) + 120)
    fig.update_layout(height=height, yaxis={"autorange": "reversed"}, xaxis_title="value (95% interval)")
    return fig


def _cumulative_figure(report: dict[str, Any], ids: list[str]) -> go.Figure:
    """Each member's FedSV summed over the rounds so far (0 in rounds it was not aggregated in)."""
    fig = go.Figure()
    rounds = [entry["round"] for entry in report["rounds"]]
    running = dict.fromkeys(ids, 0.0)
    series: dict[str, list[float | None]] = {pid: [] for pid in ids}
    for entry in report["rounds"]:
        values = entry.get("values") or {}
        for pid in ids:
            running[pid] += float(values.get(pid) or 0.0)
            series[pid].append(running[pid] if entry.get("status") == "valued" else None)
    for pid in ids:
        fig.add_trace(
            go.Scatter(x=rounds, y=series[pid], mode="lines", name=pid, hovertemplate="%{fullData.name}, "
                       "round %{x}: %{y:.5f}<extra></extra>")
        )  # fmt: skip
    fig.update_layout(
        xaxis_title="round",
        yaxis_title="FedSV so far",
        height=420,
        showlegend=len(ids) <= 30,
        xaxis={"dtick": 1},
    )
    return fig


def _labels_figure(report: dict[str, Any], ids: list[str]) -> go.Figure | None:
    classes = report.get("classes", {})
    if not classes.get("labels"):
        return None
    z = [
        [(classes["totals"].get(pid) or [None] * classes["labels"])[k] for k in range(classes["labels"])]
        for pid in ids
    ]
    hover = "%{y}, label %{x}: %{z:.5f}<extra></extra>"
    labels = [str(k) for k in range(classes["labels"])]
    fig = go.Figure(go.Heatmap(z=z, x=labels, y=ids, colorscale="RdBu", zmid=0, hovertemplate=hover))
    fig.update_layout(height=max(300, 18 * len(ids) + 120), xaxis_title="validation label",
                      yaxis={"autorange": "reversed"})  # fmt: skip
    return fig


def _accuracy_figure(report: dict[str, Any]) -> go.Figure:
    rounds = [entry["round"] for entry in report["rounds"]]
    accuracy = [entry.get("test_accuracy") for entry in report["rounds"]]
    fig = go.Figure(go.Scatter(x=rounds, y=accuracy, mode="lines+markers", name="test accuracy"))
    fig.update_layout(
        height=330, xaxis_title="round", yaxis_title="test accuracy", margin={"t": 20}, xaxis={"dtick": 1}
    )
    return fig


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _run_section(report: dict[str, Any]) -> str:
    config, summary = report.get("config", {}), report.get("summary", {})
    settings = "".join(
        f"<tr><th>{_e(name)}</th><td>{_e(config[name])}</td></tr>" for name in SETTINGS if name in config
    )
    ratio = summary.get("bytes_ratio_to_minimum")
    traffic = (
        f"{summary.get('bytes_per_round', 0) / 1e6:,.2f} MB per round, {ratio:.3f}x the physical minimum "
        f"(one model down per selected, one delta up per received): valuation sent no message of its own"
        if ratio is not None
        else "traffic not recorded"
    )
    final = report.get("final_accuracy")
    accuracy = "no test set" if final is None else f"final test accuracy {final:.4f}"
    count = len(report["rounds"])
    return (
        f"<p>{count} round{'s' if count != 1 else ''}, {_e(accuracy)}; "
        f"{_e(traffic)}.</p><div class='run'><table class='settings'>{settings}</table>"
        "<div id='fig-accuracy'></div></div>"
    )


def _effect(effect: Any) -> str:
    """The guard's evidence on an update it did not aggregate: the validation loss's change had it been."""
    if not isinstance(effect, dict) or not isinstance(effect.get("effect"), int | float):
        return ""
    return f": validation loss {_e(format(effect['effect'], '+.4f'))} if aggregated"


def _guard_section(report: dict[str, Any]) -> str:
    rows = []
    for entry in report["rounds"]:
        absent, effects = entry.get("absent", {}), entry.get("effects", {})
        refused = (
            ", ".join(
                f"{_e(pid)} ({_e(reason)}{_effect(effects.get(pid))})" for pid, reason in absent.items()
            )
            or "none"
        )
        selected = ", ".join(f"<a href='#member-{_e(pid)}'>{_e(pid)}</a>" for pid in entry["selected"])
        rows.append(
            f"<tr><td>{entry['round']}</td><td>{_e(entry.get('status', ''))}</td><td>{selected}</td>"
            f"<td>{refused}</td></tr>"
        )
    return (
        "<table><tr><th>round</th><th>values</th><th>selected</th><th>not aggregated (why)</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _members_section(report: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    key = report.get("recommended", RECOMMENDED)
    out = []
    for row in rows:
        pid = row["participant"]
        per_round = [
            f"{entry['round']}: {_e(format((entry.get('values') or {}).get(pid, 0.0) or 0.0, '.5f'))}"
            if pid in entry.get("received", [])
            else f"{entry['round']}: {_e(entry.get('absent', {}).get(pid, 'not selected'))}"
            for entry in report["rounds"]
            if pid in entry["selected"] or pid in entry.get("received", [])
        ]
        value, error = row.get(key), row.get(f"{key}_stderr")
        shown = "?" if value is None else f"{value:.5f}" + ("" if error is None else f" ± {error:.5f}")
        if row.get("valued") is False:
            shown = "not valued (never selected; a payout holds its part out of the split)"
        out.append(
            f"<details id='member-{_e(pid)}' class='member'><summary>{_e(pid)}: {_e(key)} {_e(shown)}, "
            f"rank {_e(row.get('rank'))}, group {_e(row.get('group') or '-')}</summary>"
            f"<p>rounds: {'; '.join(per_round) or 'never selected'}</p></details>"
        )
    return "".join(out)


def _verdict_section(report: dict[str, Any]) -> str:
    verdict = report.get("verdict", {})
    groups = verdict.get("groups", [])
    listed = "".join(
        f"<li>group {k}: " + ", ".join(f"<a href='#member-{_e(p)}'>{_e(p)}</a>" for p in group) + "</li>"
        for k, group in enumerate(groups, start=1)
    )
    missing = report.get("pending_rounds", [])
    waiting = f"<p class='pending'>rounds awaiting their values: {_e(missing)}</p>" if missing else ""
    owners = "".join(f"<p class='owner'>{_e(line)}</p>" for line in owner_lines(report))
    line = _e(verdict.get("line", "no verdict yet"))
    return f"<p class='verdict'>{line}</p>{owners}{waiting}<ul>{listed}</ul>"


def _payout_section() -> str:
    values = "".join(f"<option value='{_e(v)}'>{_e(v)}</option>" for v in VALUES)
    negatives = "".join(f"<option value='{_e(v)}'>{_e(v)}</option>" for v in NEGATIVE)
    rules = "".join(f"<option value='{_e(v)}'>{_e(v)}</option>" for v in RULES)
    return (
        "<form id='payout-form' onsubmit='return false'>amount <input id='amount' type='number' min='0' "
        f"value='10000' step='any'> by <select id='value'>{values}</select> negative values "
        f"<select id='negative'>{negatives}</select> rule <select id='rule'>{rules}</select>"
        "<p>(the same split as <code>fedsv payout</code>; a link to these settings: the page's address "
        "with <code>#amount=5000&amp;value=fedsv&amp;negative=shift&amp;rule=groups</code>)</p></form>"
        "<table id='payout-table'><thead><tr><th>participant</th><th>value</th><th>share</th>"
        "<th>amount</th><th>range (95%)</th></tr></thead><tbody></tbody></table>"
    )


def render_page(report: dict[str, Any]) -> str:
    """The run's report as one self-contained HTML page."""
    rows = ranked_rows(report)
    ids = [row["participant"] for row in rows]
    figures = {
        "fig-accuracy": _figure(_accuracy_figure(report)),
        "fig-values": _figure(_values_figure(report, rows)),
        "fig-cumulative": _figure(_cumulative_figure(report, ids)),
    }
    labels = _labels_figure(report, ids)
    if labels is not None:
        figures["fig-labels"] = _figure(labels)
    payout = {
        "recommended": report.get("recommended", RECOMMENDED),
        "fallback": FALLBACK,
        "improved": improved(report),
        "z95": Z95,
        "rows": [
            {
                "participant": row["participant"],
                "valued": row.get("valued", True),
                "forfeited": row.get("rounds_identical", 0),  # payout.FORFEIT: paid nothing
                "group": row.get("group"),
                "owner_size": len(row.get("owner") or [row["participant"]]),
                **{key: row.get(key) for key in VALUES},
                **{
                    f"{key}_error": row.get(f"{key}_stderr_between", row.get(f"{key}_stderr"))
                    for key in VALUES
                },
            }
            for row in rows
        ],
    }
    sections = {
        "run": ("The run", _run_section(report)),
        "verdict": ("What the values can tell apart", _verdict_section(report)),
        "values": ("Values with their 95% intervals", "<div id='fig-values'></div>"),
        "cumulative": ("Values over the rounds", "<div id='fig-cumulative'></div>"),
        "labels": (
            "Values per validation label",
            "<div id='fig-labels'></div>" if labels is not None else "<p>not split by label</p>",
        ),
        "payout": ("Payout", _payout_section()),
        "guard": ("The guard's decisions", _guard_section(report)),
        "members": ("Members", _members_section(report, rows)),
    }
    body = "".join(
        f"<section id='{name}'><h2>{_e(title)}</h2>{content}</section>"
        for name, (title, content) in sections.items()
    )
    return PAGE.format(
        title=_e(f"fedsv report {report.get('run_id', '')}"),
        verdict=_e(report.get("verdict", {}).get("line", "no verdict yet")),
        plotly=get_plotlyjs(),
        body=body,
        figures=_script_json(figures),
        payout=_script_json(payout),
        script=SCRIPT,
    )


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0; }} td, th {{ border: 1px solid #ccc; padding: 2px 8px; }}
th {{ text-align: left; background: #f4f4f4; }} .verdict {{ font-weight: bold; }} .pending {{ color: #a40; }}
details.member {{ margin: 2px 0; }}
.run {{ display: grid; grid-template-columns: 330px 1fr; gap: 1em; align-items: start; }}
</style>
<script>{plotly}</script></head>
<body><h1>{title}</h1><p class='verdict'>{verdict}</p>{body}
<script>const FIGURES = {figures}; const PAYOUT = {payout};</script>
<script>{script}</script>
</body></html>
"""

SCRIPT = """
for (const [id, fig] of Object.entries(FIGURES)) {
  Plotly.newPlot(id, fig.data, fig.layout, {responsive: true, displaylogo: false});
}
function weights(values, negative) {
  if (negative === 'zero') return values.map(v => Math.max(v, 0));
  const lowest = Math.min(...values);
  return values.map(v => v - lowest);
}
function split(values, negative) {
  const w = weights(values, negative);
  const total = w.reduce((a, b) => a + b, 0);
  return total > 0 ? w.map(x => x / total) : null;
}
function payout() {
  const amount = Number(document.getElementById('amount').value);
  const key = document.getElementById('value').value;
  const negative = document.getElementById('negative').value;
  const rule = document.getElementById('rule').value;
  const ranked = PAYOUT.rows;
  const valued = ranked.filter(r => r.valued);  // a member never selected has no value: held out
  const missing = ranked.filter(r => !r.valued);
  const pot = ranked.length ? amount * valued.length / ranked.length : 0;
  const rows = valued.filter(r => !r.forfeited);  // sent another member's very update: paid nothing
  const forfeited = valued.filter(r => r.forfeited);
  const by = (name) => {
    let values = rows.map(r => r[name] === null ? 0 : r[name]);
    if (rule === 'groups') {  // members that cannot be told apart: paid by their group's mean over owners
      const sums = {}, counts = {};  // an owner of several participants counts once, each its equal part
      rows.forEach((r, i) => {
        if (r.group === null) return;
        sums[r.group] = (sums[r.group] || 0) + values[i];
        counts[r.group] = (counts[r.group] || 0) + 1 / r.owner_size;
      });
      values = values.map((v, i) => rows[i].group === null ? v
        : sums[rows[i].group] / counts[rows[i].group] / rows[i].owner_size);
    }
    return values;
  };
  let used = key;
  let values = by(used);
  if (used === PAYOUT.recommended && PAYOUT.improved && rows.length && split(values, negative) === null) {
    used = PAYOUT.fallback;  // the recommended value pays nobody though the model improved
    values = by(used);
  }
  const width = rows.map(r => r[used + '_error'] === null ? NaN : PAYOUT.z95 * r[used + '_error']);
  const shares = rows.length ? split(values, negative) : null;
  const body = document.querySelector('#payout-table tbody');
  body.textContent = '';
  if (shares === null || !(amount > 0)) {
    const tr = body.insertRow(); tr.insertCell().textContent = 'nothing to pay by';
    return;
  }
  const fmt = x => x.toLocaleString('en-US', {minimumFractionDigits: 2, maximumFractionDigits: 2});
  const member = (r) => {
    const tr = body.insertRow();
    tr.className = 'payout-row';
    tr.dataset.participant = r.participant;
    const link = document.createElement('a');
    link.href = '#member-' + r.participant; link.textContent = r.participant;
    tr.insertCell().appendChild(link);
    return tr;
  };
  rows.forEach((r, i) => {
    let range = '?';
    if (!Number.isNaN(width[i])) {
      const move = width.map(w => Number.isNaN(w) ? 0 : w);
      const low = values.map((v, j) => j === i ? v - move[j] : v + move[j]);
      const high = values.map((v, j) => j === i ? v + move[j] : v - move[j]);
      const lo = split(low, negative), hi = split(high, negative);
      range = fmt((lo ? lo[i] : 0) * pot) + ' - ' + fmt((hi ? hi[i] : 0) * pot);
    }
    const tr = member(r);
    tr.insertCell().textContent = r[used] === null ? '?' : r[used].toFixed(5);
    tr.insertCell().textContent = (100 * shares[i]).toFixed(2) + '%';
    const cell = tr.insertCell(); cell.className = 'amount'; cell.textContent = fmt(shares[i] * pot);
    tr.insertCell().textContent = range;
  });
  forfeited.forEach(r => {
    const tr = member(r);
    tr.insertCell().textContent = r[used] === null ? '?' : r[used].toFixed(5);
    tr.insertCell().textContent = '0.00%';
    const cell = tr.insertCell(); cell.className = 'amount'; cell.textContent = fmt(0);
    tr.insertCell().textContent = 'paid nothing: in ' + r.forfeited + ' round(s) it sent the very update '
      + 'another member sent';
  });
  missing.forEach(r => {
    const tr = member(r);
    tr.insertCell().textContent = 'not valued (never selected)';
    tr.insertCell().textContent = '-';
    const cell = tr.insertCell(); cell.className = 'amount held'; cell.textContent = 'held out';
    tr.insertCell().textContent = '-';
  });
  if (used !== key) {
    const tr = body.insertRow(); tr.className = 'fallback';
    const cell = tr.insertCell(); cell.colSpan = 5;
    cell.textContent = key + ' pays nobody (no value above 0) though the model improved: paid by ' + used;
  }
  if (missing.length) {
    const tr = body.insertRow(); tr.className = 'held-out';
    const cell = tr.insertCell(); cell.colSpan = 5;
    cell.textContent = 'held out of the split: ' + fmt(amount - pot) + ' (' + missing.length + ' of '
      + ranked.length + ' equal parts) for the members never selected';
  }
}
document.getElementById('value').value = PAYOUT.recommended;
for (const [name, setting] of new URLSearchParams(location.hash.slice(1))) {
  const field = document.getElementById(name);
  if (['amount', 'value', 'negative', 'rule'].includes(name) && field) field.value = setting;
}
for (const id of ['amount', 'value', 'negative', 'rule']) {
  document.getElementById(id).addEventListener('input', payout);
}
payout();
document.body.dataset.rendered = 'yes';
"""
