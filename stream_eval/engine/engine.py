"""The evaluation engine: events in, finalised per-request values and mergeable aggregates out.

Replay and streaming both drive one :class:`Engine`; only the transport and the source of the watermark
differ. Data flows one way: validated events -> :class:`~stream_eval.events.join.Join` -> finalised
requests -> batch metric kernels -> per-group :class:`~stream_eval.metrics.aggregates.Moments`,
sessions (AUC/GAUC) and GSB tallies -> :meth:`Engine.report`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
import numpy.typing as npt
import orjson

from stream_eval.config import Arms, Config
from stream_eval.engine.ab import AbRow, SrmRow, UnitLedger, recommend
from stream_eval.engine.compiled import fill_template, json_number_pieces, json_string_pieces
from stream_eval.engine.gsb import GsbTracker
from stream_eval.engine.labels import MISSING, OTHER, LabelBounds, shown_segment_values
from stream_eval.engine.plugins import Plugin, RegroupHooks
from stream_eval.engine.sessions import (
    Impressions,
    ScoredSessions,
    SessionKey,
    SessionRequests,
    Sessions,
    present,
)
from stream_eval.events.join import OVERFLOW, EventCounts, Finalised, Join
from stream_eval.events.schema import Chunk, CompactRanking, Feedback, Invalid, Judgment, Ranking, Watermark
from stream_eval.metrics.aggregates import Moments, grouped_moments
from stream_eval.metrics.alpha import alpha_ndcg
from stream_eval.metrics.gsb import GsbCounts
from stream_eval.metrics.kernels import JudgedBatch, evaluate_batch
from stream_eval.metrics.specs import GAUC, MetricSpec, parse, request_specs
from stream_eval.stats import sign_test

if TYPE_CHECKING:  # the types readers get from engine.windows and engine.delays; never imported to run
    from stream_eval.engine.delays import FeedbackDelays
    from stream_eval.engine.windows import RollingWindows

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
GroupKey = tuple[str, str]
#: A segment group: (experiment, arm, segment field, segment value), the value bounded (``segment_cap``, or the values
#: listed in ``segment_values``; the report shows ``max_segment_values`` of them).
SegmentKey = tuple[str, str, str, str]
_RAW_GROUP_CACHE = 10_000
#: Raw values of a segment field given a code for :meth:`Engine.segments_of`'s table (others are looked up one by one).
_SEGMENT_VALUE_CODES = 1024


#: The ids of a per-request record (docs/contract.md §4), in the order of its keys (:meth:`FinalisedBatch.ids`).
ID_FIELDS = ("request_id", "experiment", "arm", "query_id", "session_id")


class FinalisedBatch:
    """Requests finalised together, with their per-request values (``values[i, j]`` is ``specs[j]``)."""

    __slots__ = ("states", "specs", "values")

    def __init__(self, states: Sequence[CompactRanking], specs: tuple[MetricSpec, ...], values: Floats) -> None:
        self.states = states
        self.specs = specs
        self.values = values

    def id_columns(self) -> list[list[str]]:
        """The ids of each request's record as five columns, one list per field of :data:`ID_FIELDS`: ``query_id``
        and ``session_id`` default to the request's id."""
        states = self.states
        rids: list[str] = list(map(_REQUEST_ID, states))
        columns = [rids, list(map(_EXPERIMENT, states)), list(map(_ARM, states))]
        for given in (list(map(_QUERY_ID, states)), list(map(_SESSION_ID, states))):
            columns.append([rid if value is None else value for rid, value in zip(rids, given, strict=True)]
                           if None in given else given)
        return columns

    def records(self) -> Iterable[dict[str, Any]]:
        """One docs/contract.md §4 per-request record per request (NaN becomes ``None``)."""
        names = [spec.name for spec in self.specs]
        with_nan = np.isnan(self.values).any(axis=1).tolist()
        for (rid, experiment, arm, query, session), row, nan in zip(zip(*self.id_columns(), strict=True),
                                                                     self.values.tolist(), with_nan, strict=True):
            yield {"request_id": rid, "experiment": experiment, "arm": arm, "query_id": query, "session_id": session,
                   "metrics": {name: (None if v != v else v) for name, v in zip(names, row, strict=True)} if nan
                   else dict(zip(names, row, strict=True))}

    def encoded(self) -> list[bytes]:
        """:meth:`records` as JSON, each the bytes of ``orjson.dumps(record)``: :meth:`encoded_values` cut apart.

        >>> from types import SimpleNamespace as Of
        >>> batch = FinalisedBatch([Of(request_id="r1", experiment="e", arm="a", query_id=None, session_id=None),
        ...                         Of(request_id="r2", experiment="e", arm="a", query_id="q", session_id='s"')],
        ...                        (Of(name="RR"), Of(name="P@10")), np.array([[0.5, 1.0], [np.nan, 0.0]]))
        >>> for text in batch.encoded():
        ...     print(text.decode())
        {"request_id":"r1","experiment":"e","arm":"a","query_id":"r1","session_id":"r1","metrics":{"RR":0.5,"P@10":1.0}}
        {"request_id":"r2","experiment":"e","arm":"a","query_id":"q","session_id":"s\\"","metrics":{"RR":null,"P@10":0.0}}
        """
        text, ends = self.encoded_values()
        whole, bounds = text.tobytes(), ends.tolist()
        return [whole[a:b] for a, b in zip([0, *bounds][:-1], bounds, strict=True)]

    def encoded_values(self, end: bytes = b"") -> tuple[npt.NDArray[np.uint8], Ints]:
        """:meth:`records` as JSON, the bytes of each ``orjson.dumps(record)`` (followed by ``end``: a line feed for
        JSON lines) one after the other, and where each ends; made a column at a time, without an object per record:
        each id column and the values encoded in one ``orjson`` call, cut into pieces and put into a template per
        record by compiled loops (``engine/compiled.py``)."""
        count = len(self.states)
        if count == 0:
            return np.empty(0, dtype=np.uint8), np.empty(0, dtype=np.int64)
        names = [orjson.dumps(spec.name) for spec in self.specs]
        constants = [b'{"' + ID_FIELDS[0].encode() + b'":"']
        constants += [b'","' + name.encode() + b'":"' for name in ID_FIELDS[1:]]
        if names:
            constants += [b'","metrics":{' + names[0] + b":", *(b"," + name + b":" for name in names[1:]), b"}}" + end]
        else:
            constants.append(b'","metrics":{}}' + end)
        texts = [orjson.dumps(column) for column in self.id_columns()]
        if names:  # every value in one call (NaN is null), in C order: request by request
            values = np.ascontiguousarray(self.values, dtype=np.float64).ravel()  # (orjson reads C order only)
            texts.append(orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY))
        text = np.frombuffer(b"".join(texts), dtype=np.uint8)
        fields = len(ID_FIELDS) + len(names)
        starts, ends = np.empty((fields, count), dtype=np.int64), np.empty((fields, count), dtype=np.int64)
        base = 0
        for k in range(len(ID_FIELDS)):
            json_string_pieces(text[base:], count, starts[k], ends[k])
            starts[k] += base
            ends[k] += base
            base += len(texts[k])
        if names:
            numbers = count * len(names)
            first, last = np.empty(numbers, dtype=np.int64), np.empty(numbers, dtype=np.int64)
            json_number_pieces(text[base:], numbers, first, last)
            starts[len(ID_FIELDS):] = first.reshape(count, len(names)).T + base
            ends[len(ID_FIELDS):] = last.reshape(count, len(names)).T + base
        pieces = np.frombuffer(b"".join(constants), dtype=np.uint8)
        return fill_template(text, starts, ends, pieces, np.cumsum([len(piece) for piece in constants]))


class SessionRows(NamedTuple):
    """Closed sessions' session measures (:meth:`Engine._session_rows`): the sessions (indexes into the scored
    sessions), a row per session with a column per session measure: its value, how many per-request values it
    sums, and the sum of their squares."""

    sessions: Ints
    values: Floats
    counts: Floats
    squares: Floats


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
        # session measures (QueriesPerSession, Reformulation): columns valued when sessions close (_session_rows)
        self._session_columns = [j for j, spec in enumerate(self.specs) if spec.per_session]
        self._record_columns = [j for j, spec in enumerate(self.specs) if not spec.per_session]
        self._record_specs = tuple(self.specs[j] for j in self._record_columns)
        self._lower_is_better = {spec.mean_name for spec in self.specs if spec.definition.lower_is_better}
        # alpha-nDCG columns, filled here from the items' subtopics: (column, cutoff, alpha)
        self._alpha_columns = [(j, s.k or 0, float(s.resolve(config)["alpha"]))
                               for j, s in enumerate(self.specs) if s.needs_subtopics]
        self.on_finalised = on_finalised
        self.batch_size = batch_size
        self.labels = LabelBounds(config.max_label_values)
        self.group_keys: list[GroupKey] = []
        self._group_index: dict[GroupKey, int] = {}
        self._raw_groups: dict[GroupKey, int] = {}
        self.groups: list[GroupStats] = []
        # segment groups (config ``segments``): a request is in one per segment field, besides its group
        self.segment_fields = config.segments
        self._segment_allowed = config.segment_allowed()
        self.segment_keys: list[SegmentKey] = []
        self._segment_index: dict[SegmentKey, int] = {}
        self._raw_segments: dict[SegmentKey, int] = {}
        # per segment field: each raw value's code, and the segment group of each (group, code) met, -1 if none yet
        self._value_codes: list[dict[str, int]] = [{} for _ in self.segment_fields]
        self._segment_table: list[Ints] = [np.full((0, 0), -1, dtype=np.int64) for _ in self.segment_fields]
        self.segment_groups: list[GroupStats] = []
        self.arms_seen: dict[str, set[str]] = {}
        self.teams_seen: dict[str, set[str]] = {}
        self.with_subtopics = 0
        self.invalid_examples: list[Invalid] = []
        self.invalid_reasons: Counter[str] = Counter()
        self.unreadable: list[str] = []  # inputs a replay could not read to their end, and why
        self.sessions = Sessions(config)
        self._gsb_column = self._find_column(config.gsb_metric)
        self.gsb = GsbTracker(config, self.join.horizon)
        self._muted = False
        self.watermark = -math.inf  # the largest finite all-partition watermark :meth:`close` was given
        # by role, in the order they attached: live windows, the delay histogram (they attach themselves)
        self._roles: dict[str, Plugin] = {}
        self.regroup: RegroupHooks | None = None  # streaming: named sessions and query GSB go to the regroup log
        # A/B units, fed in event-time order (engine/ab.py); streaming: on the regroup stage's worker only
        self.ledger = UnitLedger(config, [spec.mean_name for spec in self.specs], GAUC)
        self.stage_watermark = -math.inf  # how far sessions, GSB buckets and A/B units were closed here

    def attach(self, plugin: Plugin) -> None:
        """From now on, tell ``plugin`` what happens (``engine/plugins.py``); readers find it by its role."""
        if plugin.role in self._roles:
            raise ValueError(f"the engine has {plugin.role} already")
        self._roles[plugin.role] = plugin
        plugin.opened(self.join)

    @property
    def windows(self) -> RollingWindows | None:
        """The rolling windows attached, if any."""
        return cast("RollingWindows | None", self._roles.get("windows"))

    @property
    def delays(self) -> FeedbackDelays | None:
        """The feedback delay histogram attached, if any."""
        return cast("FeedbackDelays | None", self._roles.get("delays"))

    def _find_column(self, name: str) -> int:
        return self.specs.index(parse(name))  # Config has checked that gsb_metric is computed

    # -- input --------------------------------------------------------------------------------------
    def process(
        self,
        events: Iterable[Ranking | CompactRanking | Feedback | Judgment | Watermark | Invalid] | Chunk,
        join: Join | None = None,
        event_time: bool = True,
    ) -> None:
        """Feed events in arrival order; event time advances with them (the watermark is the max ts seen).

        ``join`` is the join of one input partition when streaming (see :meth:`new_join`); by default the
        engine's own join, which replay uses for the whole input. With ``event_time=False`` the events do
        not move event time: the caller does, with :meth:`advance` (streaming takes the minimum over topics).
        """
        join = self.join if join is None else join
        chunk = events if isinstance(events, Chunk) else Chunk.of(events if isinstance(events, list) else list(events))
        if not event_time or not (Watermark in map(type, chunk.events)  # (one C-level scan in the usual chunk)
                                  and any(type(e) is Watermark and e.end for e in chunk.events)):
            self._process_chunk(chunk, join, event_time)
        else:  # the end of a partition on event time: the join is flushed where it comes
            listed = chunk.as_list()
            self._process_mixed(listed, list(map(type, listed)), join, event_time)
        if event_time:
            self.advance(join.watermark, join)
        for plugin in self._roles.values():
            plugin.advanced(join, self._muted)

    def _process_chunk(self, chunk: Chunk, join: Join, event_time: bool = True) -> None:
        """:meth:`process` without the end of a partition: judgments and invalid events are taken first (as
        :meth:`_process_mixed` does), then the join gets the rest (feedback read as columns stays so). On event
        time, each event's lateness is judged by the largest time before it; otherwise by the join's watermark,
        which the caller moves (watermark events count nothing then)."""
        if not len(chunk):
            return
        objects: list[Any] = chunk.events
        objects_at = chunk.events_at
        types = list(map(type, objects))
        ts = np.empty(len(chunk) if event_time else 0)
        if event_time:
            ts[chunk.feedback_at] = chunk.feedback.ts
        if _JOINED.issuperset(types):
            if event_time:
                ts[objects_at] = list(map(_TS, objects))
        else:
            for event, kind in zip(objects, types, strict=True):
                if kind is Judgment:
                    self.judgment(event)
                elif kind is Invalid:
                    self.invalid(event)
            if event_time:
                ts[objects_at] = [-math.inf if kind is Invalid else e.ts
                                  for e, kind in zip(objects, types, strict=True)]
            joined = [k for k, kind in enumerate(types) if kind in _JOINED]
            objects, objects_at = [objects[k] for k in joined], objects_at[joined]
        plain = chunk.plain
        if plain is not None and types.count(CompactRanking) + types.count(Ranking) != len(plain):  # not all read
            plain.fill_items()
            plain = None
        if not event_time:
            join.add_columns(objects, objects_at, chunk.feedback, chunk.feedback_at, None, plain)
            return
        before = np.maximum.accumulate(np.concatenate(([join.watermark], ts[:-1])))
        watermark = max(join.watermark, float(ts.max()))
        join.add_columns(objects, objects_at, chunk.feedback, chunk.feedback_at, before, plain)
        join.watermark = watermark

    def _process_mixed(self, events: list[Any], types: list[type], join: Join, event_time: bool) -> None:
        """:meth:`process` for events that are not all rankings and feedback: judgments and invalid events are
        taken in turn, the join gets the rest in one call, and the end of a partition flushes it where it is."""
        joined: list[Any] = []
        before: list[float] = []
        watermark = join.watermark
        for event, kind in zip(events, types, strict=True):
            if kind in _JOINED:
                joined.append(event)
                before.append(watermark)
            elif kind is Judgment:
                self.judgment(event)
            elif kind is Watermark:
                if event_time and event.end:
                    self._join_events(join, joined, before, event_time, watermark)
                    joined, before = [], []
                    self.flush(join)
                    watermark = join.watermark
                    continue
            else:
                self.invalid(event)
                continue
            if event_time and event.ts > watermark:
                watermark = event.ts
        self._join_events(join, joined, before, event_time, watermark)

    @staticmethod
    def _join_events(join: Join, joined: list[Any], before: list[float], event_time: bool,
                     watermark: float) -> None:
        if joined:
            join.add(joined, np.array(before) if event_time else None)
        if event_time:
            join.watermark = watermark

    def new_join(self) -> Join:
        """A join for one more input partition, counting into this engine's event counts."""
        join = Join(self.config, self.counts)
        for plugin in self._roles.values():
            plugin.opened(join)
        return join

    @contextmanager
    def muted(self, join: Join) -> Iterator[None]:
        """Rebuild ``join``'s state from events already counted elsewhere: nothing is counted or finalised.

        Nests: leaving an inner ``muted`` restores what the outer one set.
        """
        was_muted, counts = self._muted, join.counts
        self._muted = True
        join.counts = EventCounts()
        try:
            yield
        finally:
            self._muted = was_muted
            join.counts = counts

    def judgment(self, event: Judgment) -> None:
        if self._muted:
            return
        self.counts["judgment", "ok"] += 1
        experiment = self.labels.value("experiment", event.experiment)
        if self.regroup is None:
            self.gsb.judgment(experiment, event.verdict)
        else:  # counted by the regroup stage, which keeps every verdict for the sign test
            self.regroup.judgment(experiment, event.verdict)

    def invalid(self, event: Invalid) -> None:
        if self._muted:
            return
        self.counts[event.kind, "invalid"] += 1
        self.invalid_reasons[f"{event.kind}: {event.code}"] += 1
        if len(self.invalid_examples) < 10:
            self.invalid_examples.append(event)

    def advance(self, watermark: float, join: Join | None = None) -> None:
        """Move event time forward and finalise every request, session and GSB bucket it closes.

        With a partition's ``join``, only that partition's requests are finalised; sessions and GSB buckets,
        which span partitions, close on :meth:`close` with the watermark of all partitions.
        """
        own = join is None or join is self.join
        join = self.join if join is None else join
        self._finalise_all(join.advance(watermark))
        if own:
            self.close(join.watermark)

    def close(self, watermark: float, sessions: bool = True, windows: bool = True) -> None:
        """Close the sessions and GSB buckets that event time ``watermark`` (of every partition) has passed.

        When streaming with a regroup stage, the worker moves the live windows (``sessions=False``) and the
        stage closes sessions and GSB buckets on its own watermark (``windows=False``).
        """
        if windows:
            if self.watermark < watermark < math.inf:
                self.watermark = watermark
            for plugin in self._roles.values():
                plugin.closed(watermark)
        if sessions:
            self.stage_watermark = max(self.stage_watermark, watermark)
            self._add_sessions(self.sessions.close(watermark))
            # rebuilding (muted): what closes was counted by the previous owner
            self.gsb.close(watermark, self.arms_of, count=not self._muted)
            self.ledger.release(watermark)

    def finalise_until(self, watermark: float) -> None:
        """Finalise the requests of this engine's own join that event time ``watermark`` closes, closing nothing
        else (a partition's engine when streaming: sessions, GSB and windows close on every partition's time)."""
        self._finalise_all(self.join.advance(watermark))

    def finalise_open(self) -> None:
        """End of a partition: finalise every request of this engine's own join, closing nothing else."""
        self._finalise_all(self.join.flush())

    def flush(self, join: Join | None = None) -> None:
        """End of input: finalise everything still open (of one partition's ``join``, or everything)."""
        own = join is None or join is self.join
        join = self.join if join is None else join
        self._finalise_all(join.flush())
        if own:
            self.close(math.inf)

    def _finalise_all(self, finalised: Finalised) -> None:
        if self._muted:
            return
        for part in finalised.split(self.batch_size):
            self._finalise(part)

    # -- finalisation ---------------------------------------------------------------------------------
    def group_of(self, experiment: str, arm: str) -> int:
        """Index of the group of an experiment and arm (label values bounded)."""
        index = self._raw_groups.get((experiment, arm))
        if index is not None:
            return index
        key = (self.labels.value("experiment", experiment), self.labels.value("arm", arm))
        index = self._group_index.get(key)
        if index is None:
            index = self._group_index[key] = len(self.group_keys)
            self.group_keys.append(key)
            self.groups.append(GroupStats(len(self.specs)))
        if len(self._raw_groups) < _RAW_GROUP_CACHE:
            self._raw_groups[experiment, arm] = index
        return index

    def segment_of(self, experiment: str, arm: str, field: str, value: str) -> int:
        """Index of the segment group of an experiment, arm, segment field and value (each bounded)."""
        raw = (experiment, arm, field, value)
        index = self._raw_segments.get(raw)
        if index is not None:
            return index
        bounded = value if value == MISSING or value == OTHER else self.labels.segment(
            field, value, self.config.segment_cap, self._segment_allowed.get(field))
        key = (*self.group_keys[self.group_of(experiment, arm)], field, bounded)
        index = self._segment_index.get(key)
        if index is None:
            index = self._segment_index[key] = len(self.segment_keys)
            self.segment_keys.append(key)
            self.segment_groups.append(GroupStats(len(self.specs)))
        if len(self._raw_segments) < _RAW_GROUP_CACHE:
            self._raw_segments[raw] = index
        return index

    def segments_of(self, rankings: Sequence[Any], group: Ints | None = None) -> Ints:
        """The segment group of each request for each segment field: shape (requests, fields); ``group``: the
        requests' groups (:meth:`group_of`), if known. A ranking without the field in its ``attributes`` has the value
        ``__missing__``. (Per field, each raw value has a code, found by ``map`` in C, and a table the segment group of
        each (group, code) met, read by numpy; only pairs not met yet go through :meth:`segment_of`, one by one.)"""
        fields = self.segment_fields
        out = np.empty((len(rankings), len(fields)), dtype=np.int64)
        if not len(rankings):
            return out
        if group is None:
            group = self.groups_of(rankings)
        attributes = _attributes_of(rankings)
        for f, field in enumerate(fields):
            values = list(map(dict.get, attributes, repeat(field), repeat(MISSING)))
            code = np.fromiter(map(self._value_codes[f].get, values, repeat(-2)), dtype=np.int64, count=len(values))
            for i in np.flatnonzero(code == -2).tolist():  # values met for the first time
                code[i] = self._value_code(f, values[i])  # (-1: a value without a code)
            table = self._segment_table[f]
            rows, columns = int(group.max()) + 1, int(code.max()) + 1
            if rows > table.shape[0] or columns > table.shape[1]:
                grown = np.full((max(rows, 2 * table.shape[0]), max(columns, 2 * table.shape[1])), -1, dtype=np.int64)
                grown[:table.shape[0], :table.shape[1]] = table
                table = self._segment_table[f] = grown
            index = table[group, code]
            index[code < 0] = -1
            missing = np.flatnonzero(index < 0)
            for i in missing.tolist():
                g, c = int(group[i]), int(code[i])
                s = int(table[g, c]) if c >= 0 else -1
                if s < 0:
                    s = self.segment_of(rankings[i].experiment, rankings[i].arm, field, values[i])
                    if c >= 0:
                        table[g, c] = s
                index[i] = s
            out[:, f] = index
        return out

    def _value_code(self, f: int, value: str) -> int:
        """The code of a raw value of segment field ``f`` (numbered as met; -1 beyond the codes kept)."""
        codes = self._value_codes[f]
        code = codes.get(value)
        if code is None:
            if len(codes) >= _SEGMENT_VALUE_CODES:
                return -1
            code = codes[value] = len(codes)
        return code

    def groups_of(self, states: Sequence[Any]) -> Ints:
        """The group of each request (:meth:`group_of`), looked up in its cache by ``map``."""
        return self._groups_of_pairs(list(map(_EXPERIMENT_ARM, states)))

    def groups_of_labels(self, experiments: list[str], arms: list[str]) -> Ints:
        """The group of each (experiment, arm) of the two columns (:meth:`group_of`)."""
        return self._groups_of_pairs(list(zip(experiments, arms, strict=True)))

    def _groups_of_pairs(self, pairs: list[tuple[str, str]]) -> Ints:
        found = list(map(self._raw_groups.get, pairs))
        if None in found:
            found = [self.group_of(*pair) if g is None else g for g, pair in zip(found, pairs, strict=True)]
        return np.array(found, dtype=np.int64)

    def evaluate_finalised(self, finalised: Finalised) -> tuple[Floats, JudgedBatch, npt.NDArray[np.bool_]]:
        """Per-request values of finalised requests."""
        rankings = finalised.rankings
        n_shown = np.fromiter(map(_N, rankings), dtype=np.int64, count=len(rankings))
        first_click = finalised.first_click - finalised.serve
        first_click[np.isinf(first_click)] = np.nan  # no click
        batch = JudgedBatch(n_shown, finalised.shown_req, finalised.shown_pos, finalised.shown_grade,
                            finalised.unshown_req, finalised.unshown_grade, finalised.click_req, finalised.click_pos,
                            first_click, finalised.satisfied)
        result = evaluate_batch(batch, self.config, self.specs)
        values = result.values
        if self._alpha_columns:
            values[:, [j for j, _, _ in self._alpha_columns]] = np.nan
            subtopics_of = list(map(_SUBTOPICS, rankings))
            with_subtopics = present(subtopics_of)
            if not with_subtopics.any():
                return values, batch, result.empty
            relevant_rows = batch.shown_grade >= self.config.rel_threshold
            bounds = np.searchsorted(batch.shown_req, np.arange(len(rankings) + 1))
            for i in np.flatnonzero(with_subtopics).tolist():
                subtopics, ranking = subtopics_of[i], rankings[i]
                if not (result.empty[i] and self.config.empty == "skip"):
                    relevant = [False] * ranking.n
                    rows = slice(bounds[i], bounds[i + 1])
                    for position in batch.shown_pos[rows][relevant_rows[rows]].tolist():
                        relevant[position - 1] = True
                    for j, k, alpha in self._alpha_columns:
                        values[i, j] = alpha_ndcg(subtopics, relevant, k, alpha)
        return values, batch, result.empty

    def _finalise(self, finalised: Finalised) -> None:
        if not len(finalised):
            return
        states: Sequence[Any] = finalised.rankings  # a ranking has the fields of a request read here
        values, batch, empty = self.evaluate_finalised(finalised)
        plain_values = values  # what the live windows and the records get: no session values
        alone = np.flatnonzero(~present(list(map(_SESSION_ID, states)))) if self._session_columns else None
        if alone is not None and alone.shape[0]:
            # a request without session_id is a session of its own, closed with it: its session measures are its
            # own values (one query, nothing reformulated), counted with it; named sessions' when they close
            plain_values = values.copy()
            for j in self._session_columns:
                values[alone, j] = 1.0 if self.specs[j].family == "QueriesPerSession" else 0.0
        group = self.groups_of(states)
        teams_of, queries = list(map(_TEAMS, states)), list(map(_QUERY_ID, states))
        n_groups = len(self.groups)
        requests = np.bincount(group, minlength=n_groups)
        empties = np.bincount(group[empty], minlength=n_groups)
        for g, moments in enumerate(grouped_moments(group, values, n_groups)):
            if requests[g]:
                stats = self.groups[g]
                stats.requests += int(requests[g])
                stats.empty += int(empties[g])
                stats.moments += moments
        if self.segment_fields:
            self._count_segments(finalised, group, plain_values, empty)
        relevant = batch.shown_grade >= self.config.rel_threshold
        behaviour = self.sessions.behaviour
        impressions = Impressions(states, batch.shown_req[relevant], batch.shown_pos[relevant], batch.n_shown,
                                  finalised.satisfied if behaviour else None, finalised.serve)
        regroup = self.regroup
        named = None if regroup is None else self._regroup_session_parts
        columns = SessionRequests.of(states, finalised.serve)
        self._add_sessions(self.sessions.add(columns, group, impressions, named), local=regroup is None)
        interleaved = np.zeros(len(states), dtype=np.bool_)
        metric = values[:, self._gsb_column]
        self.with_subtopics += int(present(list(map(_SUBTOPICS, states))).sum())
        for i in np.flatnonzero(present(teams_of)).tolist():
            teams = teams_of[i]
            experiment = self.group_keys[group[i]][0]
            interleaved[i] = True
            self.teams_seen.setdefault(experiment, set()).update(teams)
            if regroup is None:
                self.gsb.interleaved(experiment, teams, impressions.relevant_positions(i))
            else:  # counted by the regroup stage, as judgments
                regroup.interleaved(experiment, teams, impressions.relevant_positions(i))
        # the metric of each request with a query (not interleaved) for the GSB of its query
        by_query = np.flatnonzero(present(queries) & ~interleaved & ~np.isnan(metric))
        if by_query.shape[0]:
            picked_list = by_query.tolist()
            arms = list(map(self.group_keys.__getitem__, group[by_query].tolist()))
            queries = list(map(queries.__getitem__, picked_list)) if by_query.shape[0] < len(states) else queries
            serve, picked = finalised.serve[by_query], metric[by_query]
            if regroup is None:
                self.gsb.query_metrics(arms, queries, serve, picked)
            else:
                regroup.query_metrics(arms, queries, serve.tolist(), picked.tolist())
        self._unit_contributions(finalised, columns, states, group, values, interleaved)
        for g in np.unique(group[~interleaved]).tolist():
            experiment, arm = self.group_keys[g]
            self.arms_seen.setdefault(experiment, set()).add(arm)
            if regroup is not None:
                regroup.arm(experiment, arm)
        for plugin in self._roles.values():  # (the windows take session measures as sessions close)
            plugin.finalised(finalised, group, plain_values)
        if self.on_finalised is not None:
            if self._session_columns:
                self.on_finalised(FinalisedBatch(states, self._record_specs, plain_values[:, self._record_columns]))
            else:
                self.on_finalised(FinalisedBatch(states, self.specs, values))

    def _count_segments(self, finalised: Finalised, group: Ints, values: Floats,
                        empty: npt.NDArray[np.bool_]) -> None:
        """Add finalised requests (of groups ``group``) to their segment groups: per-request values only (no session
        measure: a session may span segment values). The live windows know the segment groups of the requests they
        hold (:meth:`RollingWindows.segments <stream_eval.engine.windows.RollingWindows.segments>`)."""
        windows = self.windows
        segments = (self.segments_of(finalised.rankings, group) if windows is None else
                    windows.segments(finalised, group))
        if self._session_columns:
            values = values.copy()
            values[:, self._session_columns] = np.nan
        n_fields = len(self.segment_fields)
        flat = segments.reshape(-1)
        n_segments = len(self.segment_groups)
        requests = np.bincount(flat, minlength=n_segments)
        empties = np.bincount(segments[empty].reshape(-1), minlength=n_segments)
        repeated = np.repeat(values, n_fields, axis=0)
        for s, moments in enumerate(grouped_moments(flat, repeated, n_segments)):
            if requests[s]:
                stats = self.segment_groups[s]
                stats.requests += int(requests[s])
                stats.empty += int(empties[s])
                stats.moments += moments

    def _unit_contributions(self, finalised: Finalised, requests: SessionRequests, states: Sequence[Any],
                            group: Ints, values: Floats, interleaved: npt.NDArray[np.bool_]) -> None:
        """The A/B units' share of finalised requests (interleaved ones are no arm of a split)."""
        if not self.config.ab:
            return
        # (not interleaved: each one's unit is a str)
        ids, units = requests.ids, cast("list[str]", requests.units)
        if interleaved.any():
            picked = np.flatnonzero(~interleaved)
            rows = picked.tolist()
            states = [states[i] for i in rows]
            ids, units = [ids[i] for i in rows], [units[i] for i in rows]
            group, values, serve = group[picked], values[picked], finalised.serve[picked]
        else:
            serve = finalised.serve
        if not len(states):
            return
        keys = serve + self.join.horizon
        labels = list(map(self.group_keys.__getitem__, group.tolist()))
        experiments, arms = [e for e, _ in labels], [a for _, a in labels]
        segments = None
        if self.segment_fields:  # each request's value of every segment field, for its unit's (engine/segment_ab.py)
            attributes = _attributes_of(states)
            segments = list(zip(*(map(dict.get, attributes, repeat(field)) for field in self.segment_fields),
                                strict=True))
        if self.regroup is None:
            self.ledger.add_requests(keys, ids, experiments, arms, units, values, segments)
        else:
            self.regroup.unit_requests(keys, ids, experiments, arms, units, values, segments)

    def _regroup_session_parts(self, requests: SessionRequests, group: Ints, impressions: Impressions,
                               rows: list[int]) -> None:
        labels = list(map(self.group_keys.__getitem__, group[rows].tolist()))
        self.regroup.session_parts(  # type: ignore[union-attr]  # set
            requests, [e for e, _ in labels], [a for _, a in labels], impressions, rows)

    def add_session_parts(self, requests: SessionRequests, group: Ints, impressions: Impressions,
                          offsets: list[int], lowered: list[tuple[int, SessionKey]]) -> None:
        """Requests of named sessions regrouped from other partitions (see ``engine/regroup.py``), at ``offsets`` of
        the regroup log (``lowered``: see :meth:`Sessions.add <stream_eval.engine.sessions.Sessions.add>`)."""
        self._add_sessions(self.sessions.add(requests, group, impressions, offsets=offsets, lowered=lowered))

    def merge(self, other: Engine) -> None:
        """Add another engine's totals to this one (several workers' engines give one report).

        Finalised aggregates, scored sessions, GSB verdicts and tallies, event counts and the arms seen add up;
        open requests and sessions stay where they are. The A/B units' shards and the verdicts kept for the sign
        tests, held whole by the engine of each partition of the regroup stage, are put together.
        """
        self.counts.update(other.counts)
        self.invalid_reasons.update(other.invalid_reasons)
        self.with_subtopics += other.with_subtopics
        for key, stats in zip(other.group_keys, other.groups, strict=True):
            self.groups[self.group_of(*key)] += stats
        for segment, stats in zip(other.segment_keys, other.segment_groups, strict=True):
            self.segment_groups[self.segment_of(*segment)] += stats
        for source, target in ((other.arms_seen, self.arms_seen), (other.teams_seen, self.teams_seen)):
            for experiment, arms in source.items():
                target.setdefault(experiment, set()).update(arms)
        # What the partitions of the regroup stage hold whole (their shards of the A/B units, every verdict for the
        # sign tests) adds up: each partition's engine holds its own (a worker gives a partition's engine up with it).
        self.sessions.overflow += other.sessions.overflow
        self.gsb.overflow += other.gsb.overflow
        self.gsb.merge(other.gsb, complete=True)
        self.ledger.merge(other.ledger)
        self.stage_watermark = max(self.stage_watermark, other.stage_watermark)

    def drop_regrouped(self) -> None:
        """Forget open named sessions and query buckets (the regroup stage moved to another worker)."""
        self.sessions = Sessions(self.config)
        self.gsb.drop_open()
        self.stage_watermark = -math.inf
        self.ledger = UnitLedger(self.config, self.ledger.names[:-1], GAUC)

    def _add_sessions(self, scored: ScoredSessions | None, local: bool = True) -> None:
        """Count closed sessions in their groups and give them to the A/B units: to this engine's ledger when
        ``local`` (replay; the regroup stage, whose units are rebuilt even while muted), else to the regroup log."""
        if scored is None:
            return
        both = ~np.isnan(scored.auc)
        counted = both & (scored.weight > 0)
        rows = self._session_rows(scored) if self._session_columns and scored.requests.any() else None
        if local or not self._muted:
            self._unit_sessions(scored, counted, local, rows)
        if self._muted:
            return
        if rows is not None:
            self._count_session_rows(scored, rows)
        for g in np.unique(scored.group).tolist():
            mine = scored.group == g
            stats = self.groups[g]
            stats.sessions += int((mine & counted).sum())
            stats.single_class += int((mine & ~both).sum())
            stats.gauc.update_many(scored.auc[mine & counted].reshape(-1, 1), scored.weight[mine & counted])

    def _session_rows(self, scored: ScoredSessions) -> SessionRows:
        """The session measures of closed sessions, one row per session (sessions counted with their request,
        ``ScoredSessions.requests`` 0, have none) with a column per session measure: its ``QueriesPerSession`` (one
        value) and its ``Reformulation`` (the sum of its requests' values, standing for that many values)."""
        chosen = np.flatnonzero(scored.requests > 0)
        requests = scored.requests[chosen].astype(np.float64)
        reformulated = scored.reformulations[chosen].astype(np.float64)
        shape = (chosen.shape[0], len(self._session_columns))
        values, counts, squares = np.empty(shape), np.empty(shape), np.empty(shape)
        for c, j in enumerate(self._session_columns):
            if self.specs[j].family == "QueriesPerSession":
                values[:, c], counts[:, c], squares[:, c] = requests, 1.0, requests * requests
            else:  # each request's value is 0 or 1: its square is itself
                values[:, c], counts[:, c], squares[:, c] = reformulated, requests, reformulated
        return SessionRows(chosen, values, counts, squares)

    def _count_session_rows(self, scored: ScoredSessions, rows: SessionRows) -> None:
        """Add the session measures of closed sessions to their groups' moments (values of unit weight)."""
        group = scored.group[rows.sessions]
        columns = self._session_columns
        for g in np.unique(group).tolist():
            mine = group == g
            moments = self.groups[g].moments
            counts = rows.counts[mine].sum(axis=0)
            moments.count[columns] += counts.astype(np.int64)
            moments.weight[columns] += counts
            moments.weight_sq[columns] += counts
            moments.total[columns] += rows.values[mine].sum(axis=0)
            moments.total_sq[columns] += rows.squares[mine].sum(axis=0)

    def _unit_sessions(self, scored: ScoredSessions, counted: npt.NDArray[np.bool_], local: bool,
                       rows: SessionRows | None = None) -> None:
        """Sessions whose first request was in an arm of a split (unit not None): those with both classes give
        their GAUC share, and those with ``rows`` their session measures, one contribution each at its close point."""
        if not self.config.ab:
            return
        units = scored.units
        given = counted
        if rows is not None:
            given = counted.copy()
            given[rows.sessions] = True
        chosen = [k for k in np.flatnonzero(given).tolist() if units[k] is not None]
        if not chosen:
            return
        index = np.array(chosen, dtype=np.int64)
        labels = [self.group_keys[g] for g in scored.group[index].tolist()]
        both = counted[index]
        weight = np.where(both, scored.weight[index], 0.0)
        args = (scored.keys[index], [scored.ids[k] for k in chosen], [e for e, _ in labels], [a for _, a in labels],
                [units[k] for k in chosen], np.where(both, weight * scored.auc[index], 0.0), weight)
        if rows is None:
            if local:
                self.ledger.add_sessions(*args)
            else:
                self.regroup.unit_sessions(*args)  # type: ignore[union-attr]  # set when not local
            return
        if not local:  # (a partition's engine hands named sessions to the regroup stage; those of one go with
            # their request: it has no rows, and a regroup record could not say what each value stands for)
            raise ValueError("session measures of a partition's engine: they are scored on the regroup stage")
        row_of = np.full(scored.group.shape[0], -1, dtype=np.int64)
        row_of[rows.sessions] = np.arange(rows.sessions.shape[0])
        found = row_of[index]
        has = found >= 0
        values = np.full((index.shape[0], len(self.specs)), np.nan)
        counts = np.zeros((index.shape[0], len(self.specs)))
        at = np.ix_(np.flatnonzero(has), np.array(self._session_columns, dtype=np.int64))
        values[at], counts[at] = rows.values[found[has]], rows.counts[found[has]]
        self.ledger.add_sessions(*args, values, counts)

    def arms_of(self, experiment: str) -> Arms | None:
        """Control and treatments of an experiment: configured, else the first of its sorted arms and every other.

        Interleaved requests (with ``teams``) are not an arm; their teams name the arms when nothing else does.
        """
        arms = self.arms_seen.get(experiment) or self.teams_seen.get(experiment, set())
        return self.config.arms_for(experiment, arms)

    # -- report -----------------------------------------------------------------------------------------
    def _metric_names(self) -> list[tuple[int, str]]:
        return [
            (j, spec.mean_name)
            for j, spec in enumerate(self.specs)
            if not spec.needs_subtopics or self.with_subtopics
        ]

    def _section(self, stats: GroupStats) -> dict[str, Any]:
        means = stats.moments.mean()
        metrics: dict[str, float | None] = {name: _number(means[j]) for j, name in self._metric_names()}
        metrics[GAUC] = _number(stats.gauc.mean()[0])
        return {"requests": stats.requests, "empty": stats.empty, "sessions": stats.sessions,
                "single_class_sessions": stats.single_class, "metrics": metrics}

    def overall(self) -> GroupStats:
        total = GroupStats(len(self.specs))
        for stats in self.groups:
            total += stats
        return total

    def report(self) -> dict[str, Any]:
        """The report of docs/contract.md §4 for everything finalised so far."""
        groups = []
        for (experiment, arm), stats in sorted(zip(self.group_keys, self.groups, strict=True), key=lambda g: g[0]):
            groups.append({"experiment": experiment, "arm": arm, **self._section(stats)})
        gsb = self.gsb_rows()
        results = self.ab_results()
        return {
            "config": self.config.to_json(),
            "events": self.counts.summary(),
            "overall": self._section(self.overall()),
            "groups": groups,
            **({"segments": self.segment_rows(),
                "segment_overflow": self.segment_overflow()}
               if self.segment_fields else {}),
            "gsb": gsb,
            "ab": self.ab(results),
            **({"segment_ab": self.segment_ab()} if self.segment_fields else {}),
            "srm": self.srm(results),
            "experiments": self.experiments(results),
            "overflow": self.overflow(),
        }

    def segment_rows(self) -> list[dict[str, Any]]:
        """The report's ``segments``: per experiment, arm, segment field and value shown (:meth:`shown_segments`), its
        requests and the means of the per-request measures (GAUC and the session measures are not per segment)."""
        names = [(j, name) for j, name in self._metric_names() if not self.specs[j].per_session]
        rows = []
        for (experiment, arm, field, value), stats in sorted(self.shown_segments().items()):
            means = stats.moments.mean()
            rows.append({"experiment": experiment, "arm": arm, "segment": {"field": field, "value": value},
                         "requests": stats.requests, "empty": stats.empty,
                         "metrics": {name: _number(means[j]) for j, name in names}})
        return rows

    def shown_segments(self) -> dict[SegmentKey, GroupStats]:
        """The segment groups as the report shows them: per experiment and field, the ``max_segment_values`` values
        with the most requests (ties by name; every value of a field listed in ``segment_values``, one without
        requests too) and
        ``__missing__``, the other values' groups added into ``__other__`` (in the order of their names, so that the
        sums do not depend on the order values were met)."""
        traffic: dict[tuple[str, str], dict[str, float]] = {}
        for (experiment, _, field, value), stats in zip(self.segment_keys, self.segment_groups, strict=True):
            values = traffic.setdefault((experiment, field), {})
            values[value] = values.get(value, 0) + stats.requests
        limit = self.config.max_segment_values
        shown = {key: shown_segment_values(values, None if key[1] in self._segment_allowed else limit)
                 for key, values in traffic.items()}
        out: dict[SegmentKey, GroupStats] = {}
        for (experiment, arm, field, value), stats in sorted(zip(self.segment_keys, self.segment_groups, strict=True),
                                                             key=lambda s: s[0]):
            key = (experiment, arm, field, value if value in shown[experiment, field] else OTHER)
            folded = out.get(key)
            if folded is None:
                folded = out[key] = GroupStats(len(self.specs))
            folded += stats
        for experiment, arm, field in {key[:3] for key in out}:  # a listed value no request had: shown, with none
            for value in self._segment_allowed.get(field, ()):
                out.setdefault((experiment, arm, field, value), GroupStats(len(self.specs)))
        return out

    def segment_overflow(self, shown: bool = True) -> dict[str, int]:
        """Finalised requests in ``__other__`` per segment field: as the report shows them (``shown``), or as they
        were counted (values beyond ``segment_cap`` or not listed in ``segment_values``; what ``/metrics`` shows)."""
        out = dict.fromkeys(self.segment_fields, 0)
        groups = self.shown_segments().items() if shown else zip(self.segment_keys, self.segment_groups, strict=True)
        for (_, _, field, value), stats in groups:
            if value == OTHER:
                out[field] += stats.requests
        return out

    def overflow(self) -> dict[str, int]:
        """What state caps left out (``max_open_sessions``, ``max_open_queries``, ``max_units``,
        ``max_waiting_feedback``), by kind."""
        return {"session": self.sessions.overflow, "query": self.gsb.overflow, "unit": self.ledger.overflow,
                "waiting_feedback": self.counts[OVERFLOW, "waiting_feedback"]}

    def gsb_rows(self) -> list[dict[str, Any]]:
        """GSB per experiment, treatment (None for judgments: they name no arm) and source, with the always-valid
        sign test of good against bad."""
        rows = []
        # the sign test takes every verdict given here (a rebuilt stage's too); replay: the same as the counts
        complete = self.gsb.totals(self.arms_of, complete=True)
        nothing = GsbCounts()
        for (experiment, treatment, source), c in sorted(self.gsb.totals(self.arms_of).items(),
                                                         key=lambda item: (item[0][0], item[0][2], item[0][1])):
            every = complete.get((experiment, treatment, source), nothing)
            test = sign_test(every.good, every.same, every.bad, confidence=self.config.confidence,
                             sequential_n=self.config.sequential_n)
            lower, upper = _number(test.cs_lower), _number(test.cs_upper)
            decision = _decision_of(lower, upper)
            if lower is None and test.p_value < 1.0 - self.config.confidence and test.score != 0:
                # every verdict the same: no variance, no sequence; the always-valid sign test decides alone
                decision = "better" if test.score > 0 else "worse"
            rows.append({"experiment": experiment, "treatment": None if source == "judgment" else treatment,
                         "source": source,
                         "good": c.good, "same": c.same, "bad": c.bad,
                         "score": _number(c.score), "p_value": _number(test.p_value), "cs_lower": lower,
                         "cs_upper": upper, "decision": decision})
        return rows

    def ab_results(self) -> tuple[list[AbRow], list[SrmRow]]:
        """The ledger's A/B and SRM rows, which :meth:`ab`, :meth:`srm` and :meth:`experiments` read: computed once
        and given to each of them when more than one is wanted (between two looks, each computation takes the looks
        of every shard changed since the last: O(units))."""
        return self.ledger.results(self._ab_names())

    def ab(self, results: tuple[list[AbRow], list[SrmRow]] | None = None) -> list[dict[str, Any]]:
        """Treatment - control per experiment and metric, over randomisation units (engine/ab.py); ``results``: those
        of :meth:`ab_results`, when taken already."""
        by_key = dict(zip(self.group_keys, self.groups, strict=True))
        columns = {name: j for j, name in self._metric_names()}
        rows, _ = self.ab_results() if results is None else results
        empty = GroupStats(len(self.specs))

        def count(stats: GroupStats, metric: str) -> int:
            if metric == GAUC:
                return int(stats.gauc.count[0])
            return int(stats.moments.count[columns[metric]])

        # n_*: the requests (GAUC: sessions) of the look, of every worker's stage partitions; this engine's own
        # only from looks written before 2026-12-04, which did not count them
        return [self._ab_row(row, (row.requests_control, row.requests_treatment)
                             if row.requests_control is not None and row.requests_treatment is not None else
                             (count(by_key.get((row.experiment, row.control), empty), row.metric),
                              count(by_key.get((row.experiment, row.treatment), empty), row.metric)))
                for row in rows]

    def segment_ab(self) -> list[dict[str, Any]]:
        """The A/B rows per segment value, exploratory (README, "Segment A/B rows"): an ``ab`` row's fields but
        ``n_control``/``n_treatment``, with ``segment``, ``exploratory``, ``rest_delta``, ``rest_p_value`` and
        ``differs``; as of the last look."""
        return [self._ab_row(r.row, None, {"segment": {"field": r.field, "value": r.value}, "exploratory": True},
                             {"rest_delta": _number(r.rest_delta), "rest_p_value": _number(r.rest_p_value),
                              "differs": r.differs})
                for r in self.ledger.segment_results(self._ab_names())]

    def _ab_names(self) -> list[str]:
        return [name for _, name in self._metric_names()] + [GAUC]

    def _ab_row(self, row: AbRow, requests: tuple[int, int] | None, first: dict[str, Any] | None = None,
                last: dict[str, Any] | None = None) -> dict[str, Any]:
        """An A/B row as the report shows it (``requests``: ``n_control``, ``n_treatment``; ``first``, ``last``:
        fields after the arms and at the end). A fall is better for some measures (Abandoned, TimeToFirstClick, ...):
        the delta's sign says which arm is better."""
        lower = row.metric in self._lower_is_better
        return {
            "experiment": row.experiment, "control": row.control, "treatment": row.treatment, **(first or {}),
            "metric": row.metric, "delta": _number(row.delta), "ci_lower": _number(row.ci_lower),
            "ci_upper": _number(row.ci_upper),
            **({"n_control": requests[0], "n_treatment": requests[1]} if requests is not None else {}),
            "units_control": row.units_control, "units_treatment": row.units_treatment,
            "cs_lower": _number(row.cs_lower), "cs_upper": _number(row.cs_upper), "p_value": _number(row.p_value),
            "decision": _FLIPPED.get(row.decision, row.decision) if lower else row.decision,
            "lift": _number(row.lift), "lift_ci_lower": _number(row.lift_ci_lower),
            "lift_ci_upper": _number(row.lift_ci_upper), "lift_cs_lower": _number(row.lift_cs_lower),
            "lift_cs_upper": _number(row.lift_cs_upper), "guardrail": row.guardrail,
            **({"margin": row.margin, "margin_relative": row.margin_relative, "non_inferior": row.non_inferior,
                "breached": row.breached} if row.guardrail else {}),
            "cuped": row.cuped,
            **({"variance_reduction": _number(row.variance_reduction), "theta": _number(row.theta),
                "pre_delta": _number(row.pre_delta), "pre_p_value": _number(row.pre_p_value)}
               if row.cuped else {}),
            **(last or {}),
        }

    def experiments(self, results: tuple[list[AbRow], list[SrmRow]] | None = None) -> list[dict[str, Any]]:
        """Per experiment and treatment, the recommendation (``ship``, ``rollback``, ``keep running``) with the goal
        metrics decided better, the guardrails breached and those not shown non-inferior yet (``results``: as
        :meth:`ab`'s)."""
        rows, srm = self.ab_results() if results is None else results
        mismatched = {r.experiment for r in srm if r.mismatch}
        return [{"experiment": r.experiment, "control": r.control, "treatment": r.treatment,
                 "recommendation": r.recommendation, "better": r.better, "breached": r.breached,
                 "unproven": r.unproven, "srm_mismatch": r.srm_mismatch}
                for r in recommend(rows, self.config, mismatched)]

    def srm(self, results: tuple[list[AbRow], list[SrmRow]] | None = None) -> list[dict[str, Any]]:
        """Sample-ratio checks: units per arm against the expected split, per experiment (with CUPED, the metrics
        whose pre-period means differ between the arms; ``results``: as :meth:`ab`'s)."""
        _, rows = self.ab_results() if results is None else results
        return [{"experiment": r.experiment, "units": r.units, "expected": r.expected, "chi2": _number(r.chi2),
                 "p_value": _number(r.p_value), "sequential_p_value": _number(r.sequential_p_value),
                 "mismatch": r.mismatch, "unit_conflicts": r.unit_conflicts,
                 **({"pre_imbalance": r.pre_imbalance} if r.cuped else {})} for r in rows]


_FLIPPED = {"better": "worse", "worse": "better"}


def _decision_of(lower: float | None, upper: float | None) -> str:
    if lower is not None and upper is not None and lower > 0:
        return "better"
    if lower is not None and upper is not None and upper < 0:
        return "worse"
    return "inconclusive"


_EXPERIMENT_ARM = attrgetter("experiment", "arm")
_ATTRIBUTES = attrgetter("attributes")
_NO_ATTRIBUTES: dict[str, str] = {}


def _attributes_of(rankings: Sequence[Any]) -> list[dict[str, str]]:
    """Each ranking's ``attributes``, an empty dict for a ranking without."""
    attributes: list[dict[str, str] | None] = list(map(_ATTRIBUTES, rankings))
    if None in attributes:
        return [a if a is not None else _NO_ATTRIBUTES for a in attributes]
    return attributes  # type: ignore[return-value]  # none is None


_REQUEST_ID = attrgetter("request_id")
_EXPERIMENT = attrgetter("experiment")
_ARM = attrgetter("arm")
_TEAMS = attrgetter("teams")
_QUERY_ID = attrgetter("query_id")
_SUBTOPICS = attrgetter("subtopics")
_SESSION_ID = attrgetter("session_id")
_N = attrgetter("n")
#: Events that go to the join.
_JOINED = frozenset((CompactRanking, Ranking, Feedback))
_TS = attrgetter("ts")


def _number(value: float) -> float | None:
    value = float(value)
    return None if math.isnan(value) else value
