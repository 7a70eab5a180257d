"""GSB tallies from the three sources of SPEC §3.

* ``judgment``: each judgment event is a verdict.
* ``metric``: requests with an explicit ``query_id`` are grouped by (experiment, query, ``gsb_window``
  bucket of serve time); when the bucket can no longer change, a query served by both arms gets the
  verdict of treatment's mean ``gsb_metric`` against control's (beyond ``gsb_epsilon``).
* ``interleaving``: each request with ``teams`` credits its relevant items to teams; verdicts are resolved
  against the experiment's arms when counts are read, so an arm first seen late is still right.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, KeysView

from stream_eval.config import ArmPair, Config
from stream_eval.metrics.gsb import GsbCounts, interleaving_verdict, metric_verdict

ArmsOf = Callable[[str], ArmPair | None]
Credit = tuple[tuple[str, int], ...]


class GsbTracker:
    """Verdict counts per (experiment, source), plus the open per-query metric buckets."""

    def __init__(self, config: Config, horizon: float) -> None:
        self.window = config.gsb_window
        self.epsilon = config.gsb_epsilon
        self.horizon = horizon
        self.counts: dict[tuple[str, str], GsbCounts] = {}
        # bucket -> (experiment, query_id) -> arm -> [sum, count]; a bucket closes as a whole.
        self._queries: dict[int, dict[tuple[str, str], dict[str, list[float]]]] = {}
        self._interleaving: dict[str, Counter[Credit]] = {}

    def _counts(self, experiment: str, source: str) -> GsbCounts:
        counts = self.counts.get((experiment, source))
        if counts is None:
            counts = self.counts[experiment, source] = GsbCounts()
        return counts

    def judgment(self, experiment: str, verdict: str) -> None:
        self._counts(experiment, "judgment").add(verdict)

    def merge(self, other: GsbTracker) -> None:
        """Add another tracker's verdicts and interleaving tallies (open query buckets are not merged)."""
        for key, counts in other.counts.items():
            self.counts[key] = self.counts.get(key, GsbCounts()) + counts
        for experiment, tally in other._interleaving.items():
            self._interleaving.setdefault(experiment, Counter()).update(tally)

    def drop_open(self) -> None:
        self._queries.clear()

    def bucket_of(self, serve_ts: float) -> int:
        return int(serve_ts // self.window)

    def open_buckets(self) -> KeysView[int]:
        """The query buckets not closed yet."""
        return self._queries.keys()

    def query_metric(self, experiment: str, arm: str, query_id: str, serve_ts: float, value: float) -> None:
        """One finalised request's ``gsb_metric`` for its query."""
        self.query_metrics([(experiment, arm)], [query_id], [serve_ts], [value])

    def query_metrics(self, groups: list[tuple[str, str]], queries: list[str], serve_ts: list[float],
                      values: list[float]) -> None:
        """:meth:`query_metric` for many requests: their (experiment, arm), query, serve time and metric."""
        window, open_ = self.window, self._queries
        for (experiment, arm), query_id, ts, value in zip(groups, queries, serve_ts, values, strict=True):
            bucket = open_.get(int(ts // window))
            if bucket is None:
                bucket = open_[int(ts // window)] = {}
            per_arm = bucket.get((experiment, query_id))
            if per_arm is None:
                per_arm = bucket[experiment, query_id] = {}
            sums = per_arm.get(arm)
            if sums is None:
                per_arm[arm] = [value, 1.0]
            else:
                sums[0] += value
                sums[1] += 1.0

    def interleaved(self, experiment: str, teams: list[str], relevant_positions: list[int]) -> None:
        """One finalised interleaved request: the teams credited with its relevant items."""
        credit = Counter(teams[p - 1] for p in relevant_positions)
        tally = self._interleaving.get(experiment)
        if tally is None:
            tally = self._interleaving[experiment] = Counter()
        tally[tuple(sorted(credit.items()))] += 1

    def close(self, watermark: float, arms_of: ArmsOf, count: bool = True) -> None:
        """Give verdicts to the query buckets that no finalisation can change any more (``count=False``:
        just forget them)."""
        if not self._queries:
            return
        closing = [b for b in self._queries if (b + 1) * self.window + self.horizon <= watermark]
        if not count:
            for bucket in closing:
                del self._queries[bucket]
            return
        pairs: dict[str, ArmPair | None] = {}
        for key, per_arm in ((k, v) for b in sorted(closing) for k, v in self._queries.pop(b).items()):
            if key[0] not in pairs:
                pairs[key[0]] = arms_of(key[0])
            pair = pairs[key[0]]
            if pair is None or pair.control not in per_arm or pair.treatment not in per_arm:
                continue
            treatment, control = per_arm[pair.treatment], per_arm[pair.control]
            verdict = metric_verdict(treatment[0] / treatment[1], control[0] / control[1], self.epsilon)
            self._counts(key[0], "metric").add(verdict)

    def totals(self, arms_of: ArmsOf) -> dict[tuple[str, str], GsbCounts]:
        """All counts, the interleaving tallies resolved with the arms as they are known now."""
        out = {key: GsbCounts() + value for key, value in self.counts.items()}
        for experiment, tally in self._interleaving.items():
            pair = arms_of(experiment)
            if pair is None:
                continue
            counts = out.setdefault((experiment, "interleaving"), GsbCounts())
            for credit, times in tally.items():
                verdict = interleaving_verdict(dict(credit), pair.control, pair.treatment)
                if verdict is not None:
                    counts.add(verdict, times)
        return out
