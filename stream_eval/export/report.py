"""Report writers: the docs/contract.md §4 JSON, a table for people, and the per-request JSON Lines file."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import IO, Any

import orjson

from stream_eval.engine.engine import FinalisedBatch


def to_json(report: dict[str, Any]) -> bytes:
    """The report as indented JSON (NaN never appears: undefined values are ``null``)."""
    return orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n"


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def _interval(lower: object, upper: object) -> str:
    return f"[{_fmt(lower)}, {_fmt(upper)}]"


def percent(value: object) -> str:
    """A relative lift as a signed percentage (``-`` when undefined)."""
    if not isinstance(value, float) or not math.isfinite(value):
        return "-"
    return f"{100 * value:+.2f}%"


def variance_reduction(row: dict[str, Any]) -> str:
    """CUPED's variance reduction of an ``ab`` row as a percentage (``-`` without CUPED)."""
    value = row.get("variance_reduction")
    if not row.get("cuped") or not isinstance(value, float) or not math.isfinite(value):
        return "-"
    return f"{100 * value:.1f}%"


def add_column(header: list[str], rows: list[list[str]], name: str, cells: Iterable[str]) -> None:
    """Append column ``name`` with ``cells`` (one per row) to a table."""
    header.append(name)
    for row, cell in zip(rows, cells, strict=True):
        row.append(cell)


def pre_period_check(row: dict[str, Any], ab: Iterable[dict[str, Any]] = ()) -> str | None:
    """An ``srm`` row's pre-period check of a CUPED experiment (None without CUPED): ``ok``, the metrics whose
    arms differed before the experiment, or ``no pre-period data`` when none of the experiment's ``ab`` rows has
    a pre-period delta (no unit had a pre-period value: the rows are the unadjusted ones)."""
    if "pre_imbalance" not in row:
        return None
    if row["pre_imbalance"]:
        return "IMBALANCE " + ", ".join(row["pre_imbalance"])
    mine = [a for a in ab if a.get("experiment") == row["experiment"] and a.get("cuped")]
    return "no pre-period data" if mine and all(a.get("pre_delta") is None for a in mine) else "ok"


def guardrail_status(row: dict[str, Any]) -> tuple[str, str] | None:
    """An ``ab`` row's guardrail status against its tolerated loss, as (decision of its colour, text):
    ``breached -1.00%``, ``within -0.0050``, ``unproven ...``; None for a goal metric."""
    if not row.get("guardrail"):
        return None
    margin = row.get("margin")
    tolerated = percent(margin) if row.get("margin_relative") else _fmt(margin)
    if row.get("breached"):
        return "worse", f"breached {tolerated}"
    if row.get("non_inferior"):
        return "better", f"within {tolerated}"
    return "inconclusive", f"unproven {tolerated}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    body = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])


def to_table(report: dict[str, Any], invalid_examples: list[str] | None = None) -> str:
    """A plain-text rendering of the report for a terminal."""
    events = report["events"]
    parts = ["events: " + ", ".join(f"{k} {v:,}" for k, v in events.items())]
    metric_names = list(report["overall"]["metrics"])
    counts = ("requests", "empty", "sessions", "single_class_sessions")
    header = ["experiment", "arm", "requests", "empty", "sessions", "single-class", *metric_names]
    rows = [["(all)", "", *(_fmt(report["overall"].get(k)) for k in counts),
             *(_fmt(report["overall"]["metrics"][m]) for m in metric_names)]]
    for group in report["groups"]:
        rows.append([group["experiment"], group["arm"], *(_fmt(group.get(k)) for k in counts),
                     *(_fmt(group["metrics"].get(m)) for m in metric_names)])
    parts += ["", _table(header, rows)]
    if report["gsb"]:
        rows = [[g["experiment"], g["treatment"] or "-", g["source"], str(g["good"]), str(g["same"]), str(g["bad"]),
                 _fmt(g["score"]), _interval(g["cs_lower"], g["cs_upper"]), _fmt(g["p_value"]), g["decision"]]
                for g in report["gsb"]]
        header = ["experiment", "treatment", "source", "good", "same", "bad", "score", "confidence sequence", "p",
                  "decision"]
        parts += ["", "GSB (treatment vs control; always-valid sign test)", _table(header, rows)]
    if report["ab"]:
        rows = [[a["experiment"], f"{a['treatment']} - {a['control']}", a["metric"], _fmt(a["delta"]),
                 _interval(a["cs_lower"], a["cs_upper"]), _fmt(a["p_value"]), a["decision"],
                 percent(a.get("lift")), (guardrail_status(a) or ("", ""))[1],
                 _interval(a["ci_lower"], a["ci_upper"]), f"{a['units_control']}/{a['units_treatment']}",
                 f"{a['n_control']}/{a['n_treatment']}"] for a in report["ab"]]
        level = f"{100 * report['config']['confidence']:g}%"
        header = ["experiment", "arms", "metric", "delta", f"{level} confidence sequence", "p", "decision", "lift",
                  "guardrail", "fixed interval", "units c/t", "n c/t"]
        if any(a.get("cuped") for a in report["ab"]):  # CUPED: the adjusted rows' variance reduction
            add_column(header, rows, "var. red.", map(variance_reduction, report["ab"]))
        parts += ["", "A/B over units (the confidence sequence and p stay valid however often they are read; the "
                  "fixed interval does not)", _table(header, rows)]
    if report.get("experiments"):
        rows = [[r["experiment"], f"{r['treatment']} - {r['control']}", r["recommendation"],
                 ", ".join(r["better"]) or "-", ", ".join(r["breached"]) or "-", ", ".join(r["unproven"]) or "-",
                 "MISMATCH" if r["srm_mismatch"] else "ok"] for r in report["experiments"]]
        header = ["experiment", "arms", "recommendation", "better", "guardrails breached", "guardrails unproven",
                  "sample ratio"]
        parts += ["", "Recommendation per treatment", _table(header, rows)]
    if report.get("segment_ab"):
        values = {(r["segment"]["field"], r["segment"]["value"]) for r in report["segment_ab"]}
        parts += ["", f"{len(report['segment_ab']):,} A/B rows of {len(values):,} segment values (exploratory): in "
                  "--format json's segment_ab and --html"]
    if report.get("srm"):
        rows = [[r["experiment"], " ".join(f"{arm} {n}" for arm, n in r["units"].items()),
                 " ".join(f"{arm} {share:g}" for arm, share in r["expected"].items()), _fmt(r["p_value"]),
                 _fmt(r["sequential_p_value"]), "MISMATCH" if r["mismatch"] else "ok"] for r in report["srm"]]
        header = ["experiment", "units", "expected", "chi2 p", "sequential p", "sample ratio"]
        if any("pre_imbalance" in r for r in report["srm"]):  # CUPED: the arms' pre-period compared
            add_column(header, rows, "pre-period", (pre_period_check(r, report.get("ab", ())) or "-"
                                                     for r in report["srm"]))
        parts += ["", "Sample ratio (units per arm)", _table(header, rows)]
    if invalid_examples:
        parts += ["", "invalid events (first few):", *("  " + line for line in invalid_examples)]
    return "\n".join(parts) + "\n"


class PerRequestWriter:
    """Writes one JSON line per finalised request (docs/contract.md §4 ``--per-request``)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.written = 0

    def __call__(self, batch: FinalisedBatch) -> None:
        if batch.states:  # (JSON lines: each record ends in a line feed)
            self.stream.write(batch.encoded_values(b"\n")[0].data)
        self.written += len(batch.states)
