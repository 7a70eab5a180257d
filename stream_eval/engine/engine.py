"""The evaluation engine: events in, finalised per-request values and mergeable aggregates out.

Replay and streaming both drive one :class:`Engine`; only the transport and the source of the watermark
differ. Data flows one way: validated events -> :class:`~stream_eval.events.join.Join` -> finalised
requests -> batch metric kernels -> per-group :class:`~stream_eval.metrics.aggregates.Moments`,
sessions (AUC/GAUC) and GSB tallies -> :meth:`Engine.report`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from stream_eval.config import Config
from stream_eval.engine.labels import LabelBounds
from stream_eval.events.join import EventCounts, Join, RequestState
from stream_eval.events.schema import Feedback, Invalid, Judgment, Ranking, Watermark
from stream_eval.metrics.abtest import difference
from stream_eval.metrics.aggregates import Moments, grouped_moments
from stream_eval.metrics.alpha import alpha_ndcg
from stream_eval.metrics.auc import gauc_weights, session_auc
from stream_eval.metrics.gsb import GsbCounts, interleaving_verdict, metric_verdict
from stream_eval.metrics.kernels import JudgedBatch, evaluate_batch
from stream_eval.metrics.specs import GAUC, MetricSpec, parse, request_specs

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
GroupKey = tuple[str, str]


class FinalisedBatch:
    """Requests finalised together, with their per-request values (``values[i, j]`` is ``specs[j]``)."""

    __slots__ = ("states", "specs", "values")

    def __init__(self, states: Sequence[RequestState], specs: tuple[MetricSpec, ...], values: Floats) -> None:
        self.states = states
        self.specs = specs
        self.values = values

    def records(self) -> Iterable[dict[str, Any]]:
        """One SPEC §4 per-request record per request (NaN becomes ``None``)."""
        names = [spec.name for spec in self.specs]
        for state, row in zip(self.states, self.values.tolist(), strict=True):
            ranking = state.ranking
            yield {
                "request_id": ranking.request_id,
                "experiment": ranking.experiment,
                "arm": ranking.arm,
                "query_id": ranking.query_id if ranking.query_id is not None else ranking.request_id,
                "session_id": ranking.session_id if ranking.session_id is not None else ranking.request_id,
                "metrics": {name: (None if v != v else v) for name, v in zip(names, row, strict=True)},
            }


class GroupStats:
    """Aggregates of one (experiment, arm): request and session counts, metric and GAUC moments."""

    __slots__ = ("requests", "empty", "moments", "sessions", "single_class", "gauc")

    def __init__(self, size: int) -> None:
        self.requests = 0
        self.empty = 0
        self.moments = Moments(size)
        self.sessions = 0
        self.single_class = 0
        self.gauc = Moments(1)

    def __iadd__(self, other: GroupStats) -> GroupStats:
        self.requests += other.requests
        self.empty += other.empty
        self.moments += other.moments
        self.sessions += other.sessions
        self.single_class += other.single_class
        self.gauc += other.gauc
        return self


class _Impressions:
    """Served items of finalised requests, kept per session until the session closes (for AUC)."""

    __slots__ = ("group", "n_shown", "relevant", "scores", "deadline")

    def __init__(self, group: int) -> None:
        self.group = group
        self.n_shown: list[int] = []
        self.relevant: list[list[int]] = []
        self.scores: list[list[float] | None] = []
        self.deadline = -math.inf


class Engine:
    """Joins, finalises and aggregates; call the event methods, then :meth:`flush` and :meth:`report`."""

    def __init__(
        self,
        config: Config,
        on_finalised: Callable[[FinalisedBatch], None] | None = None,
        batch_size: int = 8192,
    ) -> None:
        self.config = config
        self.counts = EventCounts()
        self.join = Join(config, self.counts)
        self.specs = request_specs(config)
        self._alpha_columns = [j for j, s in enumerate(self.specs) if s.family == "alpha-nDCG"]
        self.on_finalised = on_finalised
        self.batch_size = batch_size
        self.labels = LabelBounds(config.max_label_values)
        self.group_keys: list[GroupKey] = []
        self._group_index: dict[GroupKey, int] = {}
        self.groups: list[GroupStats] = []
        self.arms_seen: dict[str, set[str]] = {}
        self.teams_seen: dict[str, set[str]] = {}
        self.with_subtopics = 0
        self.invalid_examples: list[Invalid] = []
        self.invalid_reasons: Counter[str] = Counter()
        self._sessions: dict[str, _Impressions] = {}
        self._gsb_column = self._find_column(config.gsb_metric)
        self._gsb_queries: dict[tuple[str, str, int], dict[str, list[float]]] = {}
        self.gsb: dict[tuple[str, str], GsbCounts] = {}
        self._interleaving: dict[str, Counter[tuple[tuple[str, int], ...]]] = {}

    def _find_column(self, name: str) -> int:
        spec = parse(name)
        if spec not in self.specs:
            raise ValueError(f"gsb_metric {name!r} is not computed (cutoffs {list(self.config.cutoffs)})")
        return self.specs.index(spec)

    # -- input --------------------------------------------------------------------------------------
    def process(self, events: Iterable[Ranking | Feedback | Judgment | Watermark | Invalid]) -> None:
        """Feed events in arrival order; event time advances with them (the watermark is the max ts seen)."""
        join = self.join
        ranking, feedback = join.ranking, join.feedback
        watermark = join.watermark
        for event in events:
            kind = type(event)
            if kind is Feedback:
                feedback(event)  # type: ignore[arg-type]  # dispatched on type
            elif kind is Ranking:
                ranking(event)  # type: ignore[arg-type]  # dispatched on type
            elif kind is Judgment:
                self.judgment(event)  # type: ignore[arg-type]  # dispatched on type
            elif kind is Watermark:
                if event.end:  # type: ignore[union-attr]  # dispatched on type
                    self.flush()
                    watermark = join.watermark
                    continue
            else:
                self.invalid(event)  # type: ignore[arg-type]  # dispatched on type
                continue
            ts: float = event.ts  # type: ignore[union-attr, assignment]  # validated: epoch seconds
            if ts > watermark:
                watermark = join.watermark = ts
        self.advance(watermark)

    def judgment(self, event: Judgment) -> None:
        self.counts["judgment", "ok"] += 1
        experiment = self.labels.value("experiment", event.experiment)
        self._gsb(experiment, "judgment").add(event.verdict)

    def invalid(self, event: Invalid) -> None:
        self.counts[event.kind, "invalid"] += 1
        self.invalid_reasons[f"{event.kind}: {event.code}"] += 1
        if len(self.invalid_examples) < 10:
            self.invalid_examples.append(event)

    def advance(self, watermark: float) -> None:
        """Move event time forward and finalise every request, session and GSB window it closes."""
        finalised = self.join.advance(watermark)
        for start in range(0, len(finalised), self.batch_size):
            self._finalise(finalised[start : start + self.batch_size])
        self._close_sessions(self.join.watermark)
        self._close_gsb_queries(self.join.watermark)

    def flush(self) -> None:
        """End of input: finalise everything still open."""
        finalised = self.join.flush()
        for start in range(0, len(finalised), self.batch_size):
            self._finalise(finalised[start : start + self.batch_size])
        self._close_sessions(math.inf)
        self._close_gsb_queries(math.inf)

    # -- finalisation ---------------------------------------------------------------------------------
    def _group(self, experiment: str, arm: str) -> int:
        key = (self.labels.value("experiment", experiment), self.labels.value("arm", arm))
        index = self._group_index.get(key)
        if index is None:
            index = self._group_index[key] = len(self.group_keys)
            self.group_keys.append(key)
            self.groups.append(GroupStats(len(self.specs)))
        return index

    def evaluate(self, states: Sequence[RequestState]) -> tuple[Floats, JudgedBatch, npt.NDArray[np.bool_]]:
        """Per-request values of ``states`` as they stand now (also used for open requests' live values)."""
        n_shown: list[int] = []
        s_req: list[int] = []
        s_pos: list[int] = []
        s_grade: list[float] = []
        u_req: list[int] = []
        u_grade: list[float] = []
        for i, state in enumerate(states):
            n_shown.append(len(state.ranking.items))
            for item, grade in state.grades.items():
                position = state.position(item)
                if position:
                    s_req.append(i)
                    s_pos.append(position)
                    s_grade.append(grade)
                else:
                    u_req.append(i)
                    u_grade.append(grade)
        batch = JudgedBatch(
            np.array(n_shown, dtype=np.int64),
            np.array(s_req, dtype=np.int64),
            np.array(s_pos, dtype=np.int64),
            np.array(s_grade, dtype=np.float64),
            np.array(u_req, dtype=np.int64),
            np.array(u_grade, dtype=np.float64),
        )
        result = evaluate_batch(batch, self.config, self.specs)
        values = result.values
        if self._alpha_columns:
            values[:, self._alpha_columns] = np.nan
            for i, state in enumerate(states):
                subtopics = state.ranking.subtopics
                if subtopics is not None and not (result.empty[i] and self.config.empty == "skip"):
                    threshold = self.config.rel_threshold
                    relevant = [state.grades.get(item, 0.0) >= threshold for item in state.ranking.items]
                    for j in self._alpha_columns:
                        values[i, j] = alpha_ndcg(subtopics, relevant, self.specs[j].k or 0, self.config.alpha)
        return values, batch, result.empty

    def _finalise(self, states: Sequence[RequestState]) -> None:
        if not states:
            return
        values, batch, empty = self.evaluate(states)
        config = self.config
        group = np.empty(len(states), dtype=np.int64)
        for i, state in enumerate(states):
            ranking = state.ranking
            group[i] = self._group(ranking.experiment, ranking.arm)
            if ranking.teams is None:
                self.arms_seen.setdefault(ranking.experiment, set()).add(ranking.arm)
            if ranking.subtopics is not None:
                self.with_subtopics += 1
        n_groups = len(self.groups)
        requests = np.bincount(group, minlength=n_groups)
        empties = np.bincount(group[empty], minlength=n_groups)
        for g, moments in enumerate(grouped_moments(group, values, n_groups)):
            if requests[g]:
                stats = self.groups[g]
                stats.requests += int(requests[g])
                stats.empty += int(empties[g])
                stats.moments += moments
        relevant = batch.shown_grade >= config.rel_threshold
        self._collect_sessions(states, group, batch.shown_req[relevant], batch.shown_pos[relevant])
        self._collect_gsb(states, values[:, self._gsb_column], batch.shown_req[relevant], batch.shown_pos[relevant])
        if self.on_finalised is not None:
            self.on_finalised(FinalisedBatch(states, self.specs, values))

    # -- sessions and GAUC ----------------------------------------------------------------------------
    def _collect_sessions(self, states: Sequence[RequestState], group: Ints, rel_req: Ints, rel_pos: Ints) -> None:
        """Requests without ``session_id`` are sessions of their own and are scored at once (vectorised);
        requests of named sessions wait until the session has been idle for ``session_gap``."""
        own = [i for i, s in enumerate(states) if s.ranking.session_id is None]
        rel_by_request: dict[int, list[int]] = {}
        named = len(own) < len(states)
        if named:
            for r, p in zip(rel_req.tolist(), rel_pos.tolist(), strict=True):
                rel_by_request.setdefault(r, []).append(p)
        if own:
            index = np.full(len(states), -1, dtype=np.int64)
            index[own] = np.arange(len(own))
            keep = index[rel_req] >= 0
            self._score_sessions(
                np.array([len(states[i].ranking.items) for i in own], dtype=np.int64),
                np.arange(len(own), dtype=np.int64),
                index[rel_req[keep]],
                rel_pos[keep],
                {k: states[i].ranking.scores for k, i in enumerate(own) if states[i].ranking.scores is not None},
                group[own],
            )
        if named:
            gap = self.config.session_gap
            for i, state in enumerate(states):
                sid = state.ranking.session_id
                if sid is None:
                    continue
                session = self._sessions.get(sid)
                if session is None:
                    session = self._sessions[sid] = _Impressions(int(group[i]))
                session.n_shown.append(len(state.ranking.items))
                session.relevant.append(rel_by_request.get(i, []))
                session.scores.append(state.ranking.scores)
                session.deadline = max(session.deadline, state.deadline + gap)

    def _close_sessions(self, watermark: float) -> None:
        closing = [sid for sid, s in self._sessions.items() if s.deadline <= watermark] if self._sessions else []
        if not closing:
            return
        n_shown: list[int] = []
        part_session: list[int] = []
        rel_part: list[int] = []
        rel_pos: list[int] = []
        scores: dict[int, list[float]] = {}
        groups: list[int] = []
        for k, sid in enumerate(closing):
            session = self._sessions.pop(sid)
            groups.append(session.group)
            for n, relevant, part_scores in zip(session.n_shown, session.relevant, session.scores, strict=True):
                part = len(n_shown)
                n_shown.append(n)
                part_session.append(k)
                rel_part.extend([part] * len(relevant))
                rel_pos.extend(relevant)
                if part_scores is not None:
                    scores[part] = part_scores
        self._score_sessions(
            np.array(n_shown, dtype=np.int64), np.array(part_session, dtype=np.int64),
            np.array(rel_part, dtype=np.int64), np.array(rel_pos, dtype=np.int64), scores,
            np.array(groups, dtype=np.int64),
        )

    def _score_sessions(
        self, n_shown: Ints, part_session: Ints, rel_part: Ints, rel_pos: Ints,
        scores: dict[int, list[float]], session_group: Ints,
    ) -> None:
        """AUC of sessions made of parts (requests): each part's served items, positives at ``rel_pos``.

        Without model scores an item's score is minus its position (higher position, higher score).
        """
        n_sessions = session_group.shape[0]
        starts = np.zeros(n_shown.shape[0] + 1, dtype=np.int64)
        np.cumsum(n_shown, out=starts[1:])
        total = int(starts[-1])
        part_of = np.repeat(np.arange(n_shown.shape[0]), n_shown)
        item_scores = -(np.arange(total, dtype=np.float64) - starts[part_of] + 1.0)
        for part, values in scores.items():
            item_scores[starts[part] : starts[part + 1]] = values
        labels = np.zeros(total, dtype=np.bool_)
        labels[starts[rel_part] + rel_pos - 1] = True
        auc, positives, negatives = session_auc(part_session[part_of], item_scores, labels, n_sessions)
        weights = gauc_weights(positives, negatives, self.config.gauc_weight)
        both = ~np.isnan(auc)
        for g in np.unique(session_group).tolist():
            mine = session_group == g
            stats = self.groups[g]
            scored = mine & both & (weights > 0)
            stats.sessions += int(scored.sum())
            stats.single_class += int((mine & ~both).sum())
            stats.gauc.update_many(auc[scored].reshape(-1, 1), weights[scored])

    # -- GSB ------------------------------------------------------------------------------------------
    def _gsb(self, experiment: str, source: str) -> GsbCounts:
        counts = self.gsb.get((experiment, source))
        if counts is None:
            counts = self.gsb[experiment, source] = GsbCounts()
        return counts

    def _collect_gsb(self, states: Sequence[RequestState], metric: Floats, rel_req: Ints, rel_pos: Ints) -> None:
        window = self.config.gsb_window
        teams_rel: dict[int, list[int]] | None = None
        for i, state in enumerate(states):
            ranking = state.ranking
            if ranking.teams is not None:
                if teams_rel is None:
                    teams_rel = {}
                    for r, p in zip(rel_req.tolist(), rel_pos.tolist(), strict=True):
                        teams_rel.setdefault(r, []).append(p)
                experiment = self.labels.value("experiment", ranking.experiment)
                self.teams_seen.setdefault(experiment, set()).update(ranking.teams)
                credit: Counter[str] = Counter(ranking.teams[p - 1] for p in teams_rel.get(i, []))
                tally = self._interleaving.setdefault(experiment, Counter())
                tally[tuple(sorted(credit.items()))] += 1
            elif ranking.query_id is not None and metric[i] == metric[i]:
                experiment = self.labels.value("experiment", ranking.experiment)
                key = (experiment, ranking.query_id, int(state.ts // window))
                per_arm = self._gsb_queries.setdefault(key, {})
                sums = per_arm.setdefault(ranking.arm, [0.0, 0.0])
                sums[0] += float(metric[i])
                sums[1] += 1.0

    def _close_gsb_queries(self, watermark: float) -> None:
        if not self._gsb_queries:
            return
        window, horizon = self.config.gsb_window, self.join.horizon
        closing = [key for key in self._gsb_queries if (key[2] + 1) * window + horizon <= watermark]
        for key in closing:
            per_arm = self._gsb_queries.pop(key)
            pair = self.config.arms_for(key[0], self.arms_seen.get(key[0], set()))
            if pair is None or pair.control not in per_arm or pair.treatment not in per_arm:
                continue
            treatment, control = per_arm[pair.treatment], per_arm[pair.control]
            verdict = metric_verdict(treatment[0] / treatment[1], control[0] / control[1], self.config.gsb_epsilon)
            self._gsb(key[0], "metric").add(verdict)

    def gsb_counts(self) -> dict[tuple[str, str], GsbCounts]:
        """GSB counts per (experiment, source), the interleaving tallies resolved with the current arms."""
        counts = {key: GsbCounts() + value for key, value in self.gsb.items()}
        for experiment, tally in self._interleaving.items():
            arms = self.arms_seen.get(experiment) or self.teams_seen.get(experiment, set())
            pair = self.config.arms_for(experiment, arms)
            if pair is None:
                continue
            out = counts.setdefault((experiment, "interleaving"), GsbCounts())
            for credit, times in tally.items():
                verdict = interleaving_verdict(dict(credit), pair.control, pair.treatment)
                if verdict is not None:
                    out.add(verdict, times)
        return counts

    # -- report -----------------------------------------------------------------------------------------
    def _metric_names(self) -> list[tuple[int, str]]:
        return [
            (j, spec.mean_name)
            for j, spec in enumerate(self.specs)
            if spec.family != "alpha-nDCG" or self.with_subtopics
        ]

    def _section(self, stats: GroupStats) -> dict[str, Any]:
        means = stats.moments.mean()
        metrics: dict[str, float | None] = {name: _number(means[j]) for j, name in self._metric_names()}
        metrics[GAUC] = _number(stats.gauc.mean()[0])
        return {"requests": stats.requests, "empty": stats.empty, "sessions": stats.sessions, "metrics": metrics}

    def overall(self) -> GroupStats:
        total = GroupStats(len(self.specs))
        for stats in self.groups:
            total += stats
        return total

    def report(self) -> dict[str, Any]:
        """The report of SPEC §4 for everything finalised so far."""
        groups = []
        for (experiment, arm), stats in sorted(zip(self.group_keys, self.groups, strict=True), key=lambda g: g[0]):
            groups.append({"experiment": experiment, "arm": arm, **self._section(stats)})
        gsb = [
            {"experiment": experiment, "source": source, "good": c.good, "same": c.same, "bad": c.bad,
             "score": _number(c.score)}
            for (experiment, source), c in sorted(self.gsb_counts().items())
        ]
        return {
            "config": self.config.to_json(),
            "events": self.counts.summary(),
            "overall": self._section(self.overall()),
            "groups": groups,
            "gsb": gsb,
            "ab": self.ab(),
        }

    def ab(self) -> list[dict[str, Any]]:
        """Treatment - control per experiment and metric, with confidence intervals."""
        by_key = dict(zip(self.group_keys, self.groups, strict=True))
        out = []
        for experiment in sorted(self.arms_seen):
            pair = self.config.arms_for(experiment, self.arms_seen[experiment])
            if pair is None or (experiment, pair.control) not in by_key or (experiment, pair.treatment) not in by_key:
                continue
            control, treatment = by_key[experiment, pair.control], by_key[experiment, pair.treatment]
            names = self._metric_names()
            diffs = difference(control.moments, treatment.moments, self.config.confidence)
            rows = [(name, diffs[j]) for j, name in names]
            rows.append((GAUC, difference(control.gauc, treatment.gauc, self.config.confidence)[0]))
            for name, d in rows:
                out.append({
                    "experiment": experiment, "control": pair.control, "treatment": pair.treatment, "metric": name,
                    "delta": _number(d.delta), "ci_lower": _number(d.ci_lower), "ci_upper": _number(d.ci_upper),
                    "n_control": d.n_control, "n_treatment": d.n_treatment,
                })
        return out


def _number(value: float) -> float | None:
    value = float(value)
    return None if math.isnan(value) else value
