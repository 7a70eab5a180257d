"""A compiled reader of JSON lines (numba): the plainest feedback events and rankings, from bytes to columns.

Four events in five of a typical log are feedback: a flat object of a few short strings and numbers. Decoded
by msgspec, each becomes a Python object that is checked, then read field by field into the join's columns;
that was a quarter of a replay. :func:`scan_lines` reads such lines straight into columns (the bounds of the
request id and the item in the chunk, the kind's index, the grade and the time). It also finds the bounds of
each field of a plain ranking, which :func:`~stream_eval.events.schema.decode_chunk_columns` makes compact
without decoding the line again. Every other line, and every line it is not sure of, goes to msgspec and
:class:`~stream_eval.events.schema.Validator`, which give the reasons.

A line is read here only when the answer cannot differ from msgspec's: an object of keys and values that are
scalars or flat arrays (JSON white space allowed), keys without escapes, each key at most once, strings of
valid UTF-8 without escapes or control characters, and a ``ts`` number. What msgspec does not check (bytes that
are not UTF-8 in values it skips, a key twice) :func:`screen_lines` finds in the lines left to it.

* Feedback: ``"type": "feedback"``, a non-empty request id, an item, a kind of the config (``click`` when
  absent) with a grade, or one that has a default grade.
* Rankings: ``"type": "ranking"``, ASCII request id and items; ``items`` an array of strings; ``scores`` an array
  of JSON numbers (kept as text: ``compiled.simple_rankings`` checks their range) or null; ``teams`` and
  ``subtopics`` absent or null; ``attributes`` absent, null or a flat object of strings, each key once (anything
  else goes to msgspec). The labels (query, session, experiment, arm, unit) may be any UTF-8: :data:`WIDE` says
  which rankings have one that is not ASCII.

A ``ts`` may also be an ISO-8601 time of the form ``2026-01-01T00:00:00.123Z`` (a fraction of 1 to 6 digits, or
none; ``Z`` or an offset ``+HH:MM``), read as ``datetime.fromisoformat(ts).timestamp()`` reads it; any other string
goes to msgspec and ``parse_time``.

Numbers are read here only in the form where one division is correctly rounded (at most 15 digits, no
exponent: both the digits and the power of ten are exact doubles). Longer decimal fractions (a time in
microseconds) are left to Python's ``float``, correctly rounded as msgspec's parser is; any other number sends
the line to msgspec.
"""

from __future__ import annotations

import msgspec
import numba as nb
import numpy as np
import numpy.typing as npt

from stream_eval.events.compiled import equal_bytes

Bytes = npt.NDArray[np.uint8]
Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

_POWERS = np.array([10.0**k for k in range(16)])  # exact: 10**15 < 2**53
_MAX_DIGITS = 15
_MONTH_DAYS = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)
_EXACT_MICROS = 2**53  # microseconds since the epoch below this are exact doubles (years 1685 to 2255)
#: The keys read, numbered from 1 (0: any other key, whose scalar value is skipped).
_KEYS = (b"type", b"request_id", b"item", b"kind", b"grade", b"ts", b"items", b"scores", b"query_id", b"session_id",
         b"experiment", b"arm", b"teams", b"subtopics", b"unit_id", b"dwell", b"attributes")
_N_KEYS = len(_KEYS)
_KEY_TEXT = np.frombuffer(b"".join(_KEYS), dtype=np.uint8)
_KEY_ENDS = np.cumsum([len(k) for k in _KEYS])
_KEY_STARTS = _KEY_ENDS - np.array([len(k) for k in _KEYS])


def _bucket(first: int, last: int, length: int) -> int:
    """A key's bucket in :data:`_KEY_BY_HASH`, from its first and last byte and its length: each known key has a
    bucket of its own, so a key is compared with one known key instead of all of them."""
    return (int(first) + 5 * int(length) + int(last)) & 63


_KEY_BY_HASH = np.zeros(64, dtype=np.int64)  # bucket -> 1 + the index of the known key there, 0: none
for _number_of_key, _key in enumerate(_KEYS, start=1):
    _key_bucket = _bucket(_key[0], _key[-1], len(_key))
    if _KEY_BY_HASH[_key_bucket]:
        raise RuntimeError(f"known keys {_KEYS[_KEY_BY_HASH[_key_bucket] - 1]!r} and {_key!r} share a bucket")
    _KEY_BY_HASH[_key_bucket] = _number_of_key
_key_hash = nb.njit(cache=True, inline="always")(_bucket)  # the same function, compiled for the line reader
(_TYPE, _REQUEST_ID, _ITEM, _KIND, _GRADE, _TS, _ITEMS, _SCORES, _QUERY_ID, _SESSION_ID, _EXPERIMENT, _ARM, _TEAMS,
 _SUBTOPICS, _UNIT_ID, _DWELL, _ATTRIBUTES) = range(1, _N_KEYS + 1)
_FEEDBACK = np.frombuffer(b"feedback", dtype=np.uint8)
_RANKING = np.frombuffer(b"ranking", dtype=np.uint8)
#: What a line is, as :func:`scan_lines` tells.
FEEDBACK, RANKING = 1, 2
#: Types of values.
_ABSENT, _STRING, _NUMBER, _NULL, _BOOL, _ARRAY, _OBJECT = range(7)
#: The columns of :func:`scan_lines`'s ``fields``: start and end of each key's value (a string's inside its
#: quotes; an array with its brackets, an object with its braces; -1 for a ranking's optional value that is absent
#: or null), then the index of the kind, whether the time, the grade and the dwell were read exactly (else parse
#: their text), and whether a ranking has a label that is not ASCII (``WIDE``).
COLUMNS = {key.decode(): (2 * k, 2 * k + 1) for k, key in enumerate(_KEYS)}
KIND_INDEX, TS_EXACT, GRADE_EXACT, DWELL_EXACT, WIDE = (2 * _N_KEYS + k for k in range(5))
_WIDTH = 2 * _N_KEYS + 5
#: A line with more keys that are not read here goes to msgspec.
_MAX_OTHER_KEYS = 16
#: A ranking whose ``attributes`` has more keys goes to msgspec.
_MAX_ATTRIBUTES = 16


@nb.njit(cache=True, inline="always")
def _space(c: np.uint8) -> bool:  # pragma: no cover  # compiled
    return bool(c == 32 or c == 9 or c == 13 or c == 10)  # JSON white space


@nb.njit(cache=True, inline="always")
def _skip(b: Bytes, i: int, e: int) -> int:  # pragma: no cover  # compiled
    while i < e and _space(b[i]):
        i += 1
    return i


@nb.njit(cache=True, inline="always")
def _string_end(b: Bytes, i: int, e: int) -> tuple[int, bool]:  # pragma: no cover  # compiled
    """``b[i]`` is a quote: (the index of the closing quote, whether the string is ASCII), or (-1, False) if the
    string has an escape, a control character or bytes that are not UTF-8, or does not end on the line."""
    i += 1
    ascii = True
    while i < e:
        c = b[i]
        if c == 34:
            return i, ascii
        if c == 92 or c < 32:
            return -1, False
        if c < 128:
            i += 1
            continue
        ascii = False
        size = _utf8_size(b, i, e)
        if size < 0:
            return -1, False
        i += size
    return -1, False


@nb.njit(cache=True, inline="always")
def _utf8_size(b: Bytes, i: int, e: int) -> int:  # pragma: no cover  # compiled
    """The size of the UTF-8 sequence that the byte ``b[i]`` (128 or more) starts before ``e``, or -1 if it is
    not one: Unicode's table of well-formed sequences, as Python's strict decoder has it (no overlong forms, no
    surrogates, nothing above U+10FFFF)."""
    c = b[i]
    # the lead byte gives the length and the range of the first continuation byte
    if 0xC2 <= c <= 0xDF:
        more, low, high = 1, 0x80, 0xBF
    elif c == 0xE0:
        more, low, high = 2, 0xA0, 0xBF
    elif c == 0xED:
        more, low, high = 2, 0x80, 0x9F
    elif 0xE1 <= c <= 0xEF:
        more, low, high = 2, 0x80, 0xBF
    elif c == 0xF0:
        more, low, high = 3, 0x90, 0xBF
    elif 0xF1 <= c <= 0xF3:
        more, low, high = 3, 0x80, 0xBF
    elif c == 0xF4:
        more, low, high = 3, 0x80, 0x8F
    else:
        return -1
    if i + more >= e or not low <= b[i + 1] <= high:
        return -1
    for k in range(2, more + 1):
        if not 0x80 <= b[i + k] <= 0xBF:
            return -1
    return more + 1


@nb.njit(cache=True, inline="always")
def _array_end(b: Bytes, i: int, e: int, strings: bool) -> tuple[int, bool]:  # pragma: no cover  # compiled
    """``b[i]`` opens an array of strings (``strings``) or of JSON numbers (kept as text, their range checked by
    :func:`~stream_eval.events.compiled.simple_rankings`): (the index after its ``]``, whether its strings are
    ASCII), or (-1, False)."""
    i = _skip(b, i + 1, e)
    ascii = True
    if i < e and b[i] == 93:
        return i + 1, ascii
    while i < e:
        if strings:
            if b[i] != 34:
                return -1, False
            close, plain = _string_end(b, i, e)
            if close < 0:
                return -1, False
            ascii = ascii and plain
            i = close + 1
        else:
            i = _json_number_end(b, i, e)
            if i < 0:
                return -1, False
        i = _skip(b, i, e)
        if i < e and b[i] == 44:
            i = _skip(b, i + 1, e)
            continue
        if i < e and b[i] == 93:
            return i + 1, ascii
        return -1, False
    return -1, False


@nb.njit(cache=True, inline="always")
def _json_number_end(b: Bytes, i: int, e: int) -> int:  # pragma: no cover  # compiled
    """A JSON number at ``b[i]`` (RFC 8259: ``-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?``): the index after
    it, or -1."""
    if i < e and b[i] == 45:
        i += 1
    if i >= e:
        return -1
    if b[i] == 48:
        i += 1
    elif 49 <= b[i] <= 57:
        while i < e and 48 <= b[i] <= 57:
            i += 1
    else:
        return -1
    if i < e and b[i] == 46:
        i += 1
        if i >= e or not 48 <= b[i] <= 57:
            return -1
        while i < e and 48 <= b[i] <= 57:
            i += 1
    if i < e and (b[i] == 101 or b[i] == 69):
        i += 1
        if i < e and (b[i] == 43 or b[i] == 45):
            i += 1
        if i >= e or not 48 <= b[i] <= 57:
            return -1
        while i < e and 48 <= b[i] <= 57:
            i += 1
    return i


@nb.njit(cache=True, inline="always")
def _number(b: Bytes, i: int, e: int) -> tuple[int, float, bool]:  # pragma: no cover  # compiled
    """A JSON number at ``b[i]``: (the index after it, its value, whether the value is exact), or (-1, 0, False)
    when it is not in a form read here. Numbers with a fraction and more than 15 digits are read (to be
    parsed by the caller) but their value is not exact."""
    if i >= e:
        return -1, 0.0, False
    negative = b[i] == 45
    if negative:
        i += 1
    if i >= e or not 48 <= b[i] <= 57:
        return -1, 0.0, False
    mantissa = 0
    digits = 0
    if b[i] == 48:
        i += 1
        if i < e and 48 <= b[i] <= 57:
            return -1, 0.0, False  # a leading zero: not JSON
    while i < e and 48 <= b[i] <= 57:
        mantissa = mantissa * 10 + int(b[i]) - 48
        digits += 1
        i += 1
    decimals = 0
    if i < e and b[i] == 46:
        i += 1
        while i < e and 48 <= b[i] <= 57:
            mantissa = mantissa * 10 + int(b[i]) - 48
            digits += 1
            decimals += 1
            i += 1
        if decimals == 0:
            return -1, 0.0, False
    if i < e and (b[i] == 101 or b[i] == 69):
        return -1, 0.0, False
    if digits > _MAX_DIGITS:
        # the mantissa overflowed: a decimal fraction is parsed by the caller (as msgspec would, correctly
        # rounded); a long integer is left to msgspec
        return (i, np.nan, False) if decimals else (-1, 0.0, False)
    value = mantissa / _POWERS[decimals]
    # -0 is the integer 0, which msgspec reads as 0.0; -0.0 stays negative zero
    return i, -value if negative and (decimals or mantissa) else value, True


@nb.njit(cache=True)
def _attributes_end(b: Bytes, i: int, e: int, keys: Ints) -> int:  # pragma: no cover  # compiled
    """``b[i]`` opens an object: the index after it if it is flat, of string keys and values without escapes (valid
    UTF-8, in which two keys are the same string only if they are the same bytes), each key once and at most
    :data:`_MAX_ATTRIBUTES` of them (what ``dict[str, str]`` decodes to the same mapping); else -1. ``keys`` is
    scratch space (the bounds of the keys read)."""
    i = _skip(b, i + 1, e)
    if i < e and b[i] == 125:
        return i + 1
    n = 0
    while True:
        if i >= e or b[i] != 34 or n == _MAX_ATTRIBUTES:
            return -1
        close, _ = _string_end(b, i, e)
        if close < 0:
            return -1
        for k in range(n):
            if equal_bytes(b, keys[2 * k], keys[2 * k + 1], b, i + 1, close):
                return -1  # a key twice: msgspec keeps the last value
        keys[2 * n], keys[2 * n + 1] = i + 1, close
        n += 1
        i = _skip(b, close + 1, e)
        if i >= e or b[i] != 58:
            return -1
        i = _skip(b, i + 1, e)
        if i >= e or b[i] != 34:
            return -1
        close, _ = _string_end(b, i, e)
        if close < 0:
            return -1
        i = _skip(b, close + 1, e)
        if i < e and b[i] == 44:
            i = _skip(b, i + 1, e)
            continue
        if i < e and b[i] == 125:
            return i + 1
        return -1


@nb.njit(cache=True, inline="always")
def _digits(b: Bytes, i: int, count: int) -> int:  # pragma: no cover  # compiled
    """The number written by the ``count`` decimal digits at ``b[i]``, or -1 if they are not all digits."""
    value = 0
    for k in range(i, i + count):
        c = b[k]
        if not 48 <= c <= 57:
            return -1
        value = value * 10 + int(c) - 48
    return value


@nb.njit(cache=True)
def _iso_time(b: Bytes, a: int, z: int) -> tuple[bool, float]:  # pragma: no cover  # compiled
    """Epoch seconds of the text ``b[a:z]`` in the form ``YYYY-MM-DDTHH:MM:SS[.f]`` (1 to 6 digits of a second)
    then ``Z`` or ``+HH:MM`` / ``-HH:MM``, as ``datetime.fromisoformat(text).timestamp()`` gives them (the
    microseconds since the epoch, an integer, divided by 10**6 once: correctly rounded when below 2**53); (False, 0)
    for any other text, and for a date or time that does not exist (``parse_time`` and its reason decide)."""
    if z - a < 20 or b[a + 4] != 45 or b[a + 7] != 45 or b[a + 10] != 84 or b[a + 13] != 58 or b[a + 16] != 58:
        return False, 0.0
    year, month, day = _digits(b, a, 4), _digits(b, a + 5, 2), _digits(b, a + 8, 2)
    hour, minute, second = _digits(b, a + 11, 2), _digits(b, a + 14, 2), _digits(b, a + 17, 2)
    if year < 1 or not 1 <= month <= 12 or day < 1 or hour < 0 or hour > 23 or minute < 0 or minute > 59:
        return False, 0.0
    if second < 0 or second > 59:
        return False, 0.0
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    if day > _MONTH_DAYS[month - 1] + (1 if month == 2 and leap else 0):
        return False, 0.0
    i = a + 19
    micro = 0
    if b[i] == 46:  # '.': 1 to 6 digits
        i += 1
        places = 0
        while i < z and 48 <= b[i] <= 57:
            if places == 6:
                return False, 0.0
            micro = micro * 10 + int(b[i]) - 48
            places += 1
            i += 1
        if places == 0:
            return False, 0.0
        for _ in range(places, 6):
            micro *= 10
    offset = 0
    if i + 1 == z and b[i] == 90:  # 'Z'
        offset = 0
    elif i + 6 == z and (b[i] == 43 or b[i] == 45) and b[i + 3] == 58:
        hours, minutes = _digits(b, i + 1, 2), _digits(b, i + 4, 2)
        if hours < 0 or hours > 23 or minutes < 0 or minutes > 59:
            return False, 0.0
        offset = (hours * 3600 + minutes * 60) * (1 if b[i] == 43 else -1)
    else:
        return False, 0.0
    # days since 1970-01-01 of the proleptic Gregorian date (H. Hinnant's days_from_civil)
    y = year - 1 if month <= 2 else year
    era = y // 400
    of_era = y - era * 400
    of_year = (153 * (month - 3 if month > 2 else month + 9) + 2) // 5 + day - 1
    days = era * 146097 + of_era * 365 + of_era // 4 - of_era // 100 + of_year - 719468
    micros = ((days * 86400 + hour * 3600 + minute * 60 + second - offset) * 1_000_000) + micro
    if micros >= _EXACT_MICROS or micros <= -_EXACT_MICROS:
        return False, 0.0
    return True, micros / 1e6


@nb.njit(cache=True, inline="always")
def _literal(b: Bytes, i: int, e: int) -> tuple[int, int]:  # pragma: no cover  # compiled
    """``null``/``true``/``false`` at ``b[i]``: (the index after it, 0/1/2), or (-1, -1)."""
    if i + 4 <= e and b[i] == 110 and b[i + 1] == 117 and b[i + 2] == 108 and b[i + 3] == 108:
        return i + 4, 0
    if i + 4 <= e and b[i] == 116 and b[i + 1] == 114 and b[i + 2] == 117 and b[i + 3] == 101:
        return i + 4, 1
    if i + 5 <= e and b[i] == 102 and b[i + 1] == 97 and b[i + 2] == 108 and b[i + 3] == 115 and b[i + 4] == 101:
        return i + 5, 2
    return -1, -1


@nb.njit(cache=True)
def _line(b: Bytes, s: int, e: int, kinds: Bytes, kind_starts: Ints, kind_ends: Ints, grades: Floats, click: int,
          out: Ints, values: Floats, what: Ints, ascii: Bools, others: Ints,
          attributes: Ints) -> int:  # pragma: no cover  # compiled
    """Read the line ``b[s:e]`` if it is a feedback or a ranking in the plain form: returns FEEDBACK or RANKING
    (0: neither). ``out`` gets the bounds of each key's value (see :data:`COLUMNS`), the kind's index and
    whether the time, the grade and the dwell are exact; ``values`` the grade, the time and the dwell (NaN: none).
    ``what``, ``ascii``, ``others`` and ``attributes`` are scratch space: the type of each key's value (_ABSENT...),
    whether a string value is ASCII, the bounds of the other keys (a key repeated, known or not, leaves the line to
    msgspec and its check) and those of the keys of ``attributes``."""
    what[:] = _ABSENT
    ascii[:] = True
    n_others = 0
    i = _skip(b, s, e)
    if i >= e or b[i] != 123:
        return 0
    i = _skip(b, i + 1, e)
    grade = np.nan
    dwell = np.nan
    ts = 0.0
    ts_exact = grade_exact = dwell_exact = True
    while True:
        if i >= e or b[i] != 34:
            return 0
        close, _ = _string_end(b, i, e)
        if close < 0:
            return 0
        key = 0
        if close > i + 1:  # the one known key this one can be (by its hash), compared byte for byte
            k = _KEY_BY_HASH[_key_hash(b[i + 1], b[close - 1], close - i - 1)]
            if k and equal_bytes(b, i + 1, close, _KEY_TEXT, _KEY_STARTS[k - 1], _KEY_ENDS[k - 1]):
                key = k
        if key and what[key] != _ABSENT:
            return 0  # a repeated key: invalid (duplicate_key), said by the slow path
        if not key:  # another key: compared with the others of the line (a few at most)
            if n_others == _MAX_OTHER_KEYS:
                return 0
            for k in range(n_others):
                if equal_bytes(b, others[2 * k], others[2 * k + 1], b, i + 1, close):
                    return 0
            others[2 * n_others], others[2 * n_others + 1] = i + 1, close
            n_others += 1
        i = _skip(b, close + 1, e)
        if i >= e or b[i] != 58:
            return 0
        i = _skip(b, i + 1, e)
        if i >= e:
            return 0
        start = end = i  # the value's bounds (a string's inside its quotes)
        c = b[i]
        if c == 34:
            close, plain = _string_end(b, i, e)
            if close < 0:
                return 0
            what[key], ascii[key] = _STRING, plain
            start, end, i = i + 1, close, close + 1
            if key == _TS:  # an ISO-8601 time in the usual form: read here (anything else: msgspec, parse_time)
                read, value = _iso_time(b, start, end)
                if read:
                    what[key], ts, ts_exact = _NUMBER, value, True
        elif c == 45 or 48 <= c <= 57:
            i, value, exact = _number(b, i, e)
            if i < 0:
                return 0
            what[key] = _NUMBER
            if key == _GRADE:
                if c == 45 and not (exact and value == 0):
                    return 0  # below 0 (or perhaps): msgspec gives the reason
                grade, grade_exact = value, exact
            elif key == _DWELL:
                if c == 45 and not (exact and value == 0):
                    return 0  # below 0 (or perhaps): msgspec gives the reason
                dwell, dwell_exact = value, exact
            elif key == _TS:
                ts, ts_exact = value, exact
            end = i
        elif c == 123:
            if key != _ATTRIBUTES:
                return 0  # an object of another key: msgspec
            i = _attributes_end(b, i, e, attributes)
            if i < 0:
                return 0
            what[key] = _OBJECT
            end = i
        elif c == 91:
            i, plain = _array_end(b, i, e, key != _SCORES)
            if i < 0 or not (key == _ITEMS or key == _SCORES or key == 0):
                return 0  # an array of another key (teams, subtopics): msgspec
            what[key], ascii[key] = _ARRAY, plain
            end = i
        else:
            i, word = _literal(b, i, e)
            if i < 0:
                return 0
            what[key] = _NULL if word == 0 else _BOOL
            end = i
        if key:
            out[2 * key - 2], out[2 * key - 1] = start, end
        i = _skip(b, i, e)
        if i >= e:
            return 0
        if b[i] == 44:
            i = _skip(b, i + 1, e)
            continue
        if b[i] != 125:
            return 0
        break
    if _skip(b, i + 1, e) != e or what[_TYPE] != _STRING or what[_TS] != _NUMBER:
        return 0
    if what[_REQUEST_ID] != _STRING or out[2 * _REQUEST_ID - 1] == out[2 * _REQUEST_ID - 2]:
        return 0  # no request id, or an empty one (msgspec rejects it)
    t0, t1 = out[2 * _TYPE - 2], out[2 * _TYPE - 1]
    out[TS_EXACT], out[GRADE_EXACT], out[DWELL_EXACT] = ts_exact, grade_exact, dwell_exact
    values[1] = ts
    values[2] = dwell
    if equal_bytes(b, t0, t1, _FEEDBACK, 0, _FEEDBACK.shape[0]):
        if what[_ITEM] != _STRING or what[_GRADE] == _STRING or what[_GRADE] == _BOOL or what[_GRADE] == _ARRAY:
            return 0
        if what[_DWELL] == _STRING or what[_DWELL] == _BOOL or what[_DWELL] == _ARRAY:
            return 0  # not a number: msgspec gives the reason
        if what[_ATTRIBUTES] == _OBJECT:
            return 0  # (no field of feedback: msgspec skips it)
        kind = click
        if what[_KIND] != _ABSENT:
            if what[_KIND] != _STRING:
                return 0
            kind = -1
            for k in range(kind_starts.shape[0]):
                if equal_bytes(b, out[2 * _KIND - 2], out[2 * _KIND - 1], kinds, kind_starts[k], kind_ends[k]):
                    kind = k
                    break
        if kind < 0:
            return 0
        if what[_GRADE] != _NUMBER:
            grade = grades[kind]
            if grade != grade:
                return 0  # no default grade for this kind: msgspec's path gives the reason
        out[KIND_INDEX] = kind
        values[0] = grade
        return FEEDBACK
    if not equal_bytes(b, t0, t1, _RANKING, 0, _RANKING.shape[0]):
        return 0
    if what[_ITEMS] != _ARRAY or not (ascii[_REQUEST_ID] and ascii[_ITEMS]):
        return 0
    if not (what[_ATTRIBUTES] == _ABSENT or what[_ATTRIBUTES] == _NULL or what[_ATTRIBUTES] == _OBJECT):
        return 0  # not an object (bad_attributes): msgspec gives the reason
    if not (what[_SCORES] == _ARRAY or what[_SCORES] == _NULL or what[_SCORES] == _ABSENT):
        return 0
    wide = 0
    for key in (_QUERY_ID, _SESSION_ID, _EXPERIMENT, _ARM, _UNIT_ID):
        optional = key == _QUERY_ID or key == _SESSION_ID or key == _UNIT_ID
        if not (what[key] == _STRING or what[key] == _ABSENT or (optional and what[key] == _NULL)):
            return 0
        if what[key] == _STRING and not ascii[key]:
            wide = 1
    out[WIDE] = wide
    if not ((what[_TEAMS] == _ABSENT or what[_TEAMS] == _NULL) and (what[_SUBTOPICS] == _ABSENT
                                                                    or what[_SUBTOPICS] == _NULL)):
        return 0
    for key in (_SCORES, _QUERY_ID, _SESSION_ID, _EXPERIMENT, _ARM, _UNIT_ID, _ATTRIBUTES):
        if what[key] != _STRING and what[key] != _ARRAY and what[key] != _OBJECT:
            out[2 * key - 2] = out[2 * key - 1] = -1  # none (absent or null)
    return RANKING


def line_bounds(b: Bytes) -> Ints:
    """(start, end, line number from 0) of each non-blank line of ``b`` (blank as ``bytes.strip`` has it)."""
    return _lines(b, np.flatnonzero(b == 10))


def minified(b: Bytes) -> Bytes:
    """``b`` without the JSON white space (space, tab, CR) that stands next to a structural character (``{}[],:``)
    or at either end of a line, outside strings: the lines as a compact writer would have written them, so that
    the compiled reader takes lines written with ``json.dumps``' default separators (``", "`` and ``": "``).

    White space between two other tokens stays (``17 67`` is not ``1767``): a line that is not JSON stays one that
    is not, and a valid line keeps its meaning. Line breaks stay, so line numbers hold; a string runs to its
    closing quote (escapes skipped) or to the end of its line.

    >>> minified(np.frombuffer(b'{"a": [1, "x y"] ,\\t"b" : true }\\n  \\n{"c": 1 2}', np.uint8)).tobytes()
    b'{"a":[1,"x y"],"b":true}\\n\\n{"c":1 2}'
    """
    return _minified(b)


@nb.njit(cache=True, inline="always")
def _structural(c: np.uint8) -> bool:  # pragma: no cover  # compiled
    return bool(c == 123 or c == 125 or c == 91 or c == 93 or c == 44 or c == 58)


@nb.njit(cache=True, nogil=True)
def _minified(b: Bytes) -> Bytes:  # pragma: no cover  # compiled
    n = b.shape[0]
    out = np.empty(n, np.uint8)
    k = 0
    i = 0
    before = np.uint8(10)  # the last byte written outside white space (a line break at the start of a line)
    while i < n:
        c = b[i]
        if c == 32 or c == 9 or c == 13:
            j = i
            while j < n and (b[j] == 32 or b[j] == 9 or b[j] == 13):
                j += 1
            after = b[j] if j < n else np.uint8(10)
            if not (before == 10 or after == 10 or _structural(before) or _structural(after)):
                out[k : k + j - i] = b[i:j]
                k += j - i
            i = j
            continue
        out[k] = c
        k += 1
        i += 1
        if c == 34:  # a string: copied as it is, to its closing quote or the end of its line
            while i < n:
                c = b[i]
                if c == 10:
                    break
                out[k] = c
                k += 1
                i += 1
                if c == 92 and i < n and b[i] != 10:
                    out[k] = b[i]
                    k += 1
                    i += 1
                elif c == 34:
                    break
        before = c
    return out[:k]


def scan_lines(b: Bytes, kinds: Bytes, kind_starts: Ints, kind_ends: Ints, grades: Floats,
               click: int) -> tuple[Ints, Ints, Ints, Floats]:
    """The non-blank lines of ``b`` (blank as ``bytes.strip`` has it), and the feedback and rankings among them
    that are read here.

    One row per non-blank line: ``lines`` (start, end, line number from 0, blank lines counted), ``fast``
    (:data:`FEEDBACK`, :data:`RANKING`, or 0 for a line left to msgspec), ``fields`` (:data:`COLUMNS`),
    ``values`` (grade, ts, dwell). ``click`` is the index of the default kind (-1: none). A ranking read here still
    needs its items and scores checked (:func:`~stream_eval.events.compiled.simple_rankings`).
    """
    return _scan(b, line_bounds(b), kinds, kind_starts, kind_ends, grades, click)


@nb.njit(cache=True, inline="always")
def _blank(b: Bytes, i: int, j: int) -> bool:  # pragma: no cover  # compiled
    """Whether ``b[i:j]`` is blank as ``bytes.strip`` has it (space, tab, CR, VT, FF)."""
    for p in range(i, j):
        c = b[p]
        if not (c == 32 or c == 9 or c == 13 or c == 11 or c == 12):
            return False
    return True


@nb.njit(cache=True, nogil=True)
def _lines(b: Bytes, newlines: Ints) -> Ints:  # pragma: no cover  # compiled
    """(start, end, line number from 0) of each non-blank line of ``b``, given its newlines (numpy finds them)."""
    n = b.shape[0]
    rows = newlines.shape[0] + 1
    lines = np.empty((rows, 3), np.int64)
    k = 0
    i = 0
    for number in range(rows):
        j = newlines[number] if number < newlines.shape[0] else n
        if i >= n:
            break
        if not _blank(b, i, j):
            lines[k, 0], lines[k, 1], lines[k, 2] = i, j, number
            k += 1
        i = j + 1
    return lines[:k]


@nb.njit(cache=True, nogil=True)
def _scan(b: Bytes, lines: Ints, kinds: Bytes, kind_starts: Ints, kind_ends: Ints, grades: Floats,
          click: int) -> tuple[Ints, Ints, Ints, Floats]:  # pragma: no cover  # compiled
    rows = lines.shape[0]
    fast = np.zeros(rows, np.int64)
    fields = np.zeros((rows, _WIDTH), np.int64)
    values = np.zeros((rows, 3), np.float64)
    what = np.zeros(_N_KEYS + 1, np.int64)
    ascii = np.ones(_N_KEYS + 1, np.bool_)
    others = np.empty(2 * _MAX_OTHER_KEYS, np.int64)
    attributes = np.empty(2 * _MAX_ATTRIBUTES, np.int64)
    for k in range(rows):
        fast[k] = _line(b, lines[k, 0], lines[k, 1], kinds, kind_starts, kind_ends, grades, click, fields[k],
                        values[k], what, ascii, others, attributes)
    return lines, fast, fields, values


#: What :func:`screen_lines` says of a line: nothing against it; bytes that are not UTF-8; a key of its object
#: twice (byte for byte); a key with an escape, or many keys (the caller compares the decoded keys); more bytes
#: than :data:`MAX_EVENT_BYTES` (not read further); arrays or objects nested more than :data:`MAX_DEPTH` deep.
CLEAN, NOT_UTF8, REPEATED_KEY, ASK, TOO_LARGE, TOO_DEEP = range(6)
#: The deepest nesting of arrays and objects an event may have. Decided here, by counting brackets, and not by
#: msgspec's RecursionError: that depends on how deep the interpreter's stack already is where it is called, so the
#: same bytes could be ``too_deep`` in one decoder and ``bad_json`` in another. Far enough below the interpreter's
#: recursion limit (1,000) that msgspec never reaches it on a line this allows.
MAX_DEPTH = 512
#: The most bytes an event (a line, a message) may have. Whatever a worker writes of one event (its
#: request-metrics record, with the request id as key and again in the value; its regroup records; a dead letter)
#: then stays far below Kafka's default limit of 1 MiB a message, which a larger event could pass and crash the
#: worker on every restart.
MAX_EVENT_BYTES = 256 << 10
#: Keys of one object compared here; a line with more is an ``ASK``.
_MAX_KEYS = 32


def screen_lines(b: Bytes) -> Ints:
    """:func:`screen_spans` of each non-blank line of ``b`` (blank as ``bytes.strip`` has it), in order."""
    lines = _lines(b, np.flatnonzero(b == 10))
    return screen_spans(b, lines[:, 0], lines[:, 1])


@nb.njit(cache=True, nogil=True)
def screen_spans(b: Bytes, starts: Ints, ends: Ints) -> Ints:  # pragma: no cover  # compiled
    """What msgspec does not check in each message ``b[starts[k]:ends[k]]``: whether its bytes are UTF-8
    (:data:`NOT_UTF8` when not, wherever they are: msgspec skips the values of unknown fields unread), then whether
    arrays and objects are nested more than :data:`MAX_DEPTH` deep (:data:`TOO_DEEP`), then whether the top-level
    object has a key twice (:data:`REPEATED_KEY`; msgspec keeps the last value); before all, whether it is longer
    than :data:`MAX_EVENT_BYTES` (:data:`TOO_LARGE`). :data:`ASK` when a
    key has an escape (``"it\\u0065m"`` is ``"item"``) or there are many: the caller compares the keys decoded.

    One pass over the bytes, strings skipped by their quotes; it assumes nothing of the JSON (it only tells of
    bytes and keys), so that a line msgspec rejects gets msgspec's reason first."""
    out = np.zeros(starts.shape[0], np.int64)
    key_starts = np.empty(_MAX_KEYS, np.int64)
    key_ends = np.empty(_MAX_KEYS, np.int64)
    for k in range(starts.shape[0]):
        if ends[k] - starts[k] > MAX_EVENT_BYTES:
            out[k] = TOO_LARGE
        else:
            out[k] = _screen(b, starts[k], ends[k], key_starts, key_ends)
    return out


#: Bytes where :func:`_screen` stops: outside strings, a quote, brackets, a comma and bytes of 128 or more; inside
#: strings, a quote, a backslash and bytes of 128 or more. (Runs of other bytes are skipped in tight loops.)
_STOP_OUTSIDE = np.zeros(256, np.bool_)
_STOP_OUTSIDE[[34, 44, 91, 93, 123, 125]] = True
_STOP_OUTSIDE[128:] = True
_STOP_NESTED = _STOP_OUTSIDE.copy()  # in an array or object inside the top-level object: commas do not matter
_STOP_NESTED[44] = False
_STOP_INSIDE = np.zeros(256, np.bool_)
_STOP_INSIDE[[34, 92]] = True
_STOP_INSIDE[128:] = True


@nb.njit(cache=True, inline="always")
def _skip_string(b: Bytes, i: int, e: int) -> tuple[int, bool]:  # pragma: no cover  # compiled
    """``b[i]`` opens a string: (the index of its closing quote, or ``e``; whether it has an escape), or (-1, False)
    if its bytes are not UTF-8."""
    i += 1
    escaped = False
    while i < e:
        c = b[i]
        if not _STOP_INSIDE[c]:
            i += 1
        elif c == 34:
            return i, escaped
        elif c == 92:
            escaped = True
            i += 2 if i + 1 < e and b[i + 1] < 128 else 1  # (a byte after it still has its UTF-8 checked)
        else:
            size = _utf8_size(b, i, e)
            if size < 0:
                return -1, False
            i += size
    return e, escaped


@nb.njit(cache=True, inline="always")
def _screen(b: Bytes, s: int, e: int, key_starts: Ints, key_ends: Ints) -> int:  # pragma: no cover  # compiled
    i = _skip(b, s, e)
    top = i < e and b[i] == 123  # an object: its keys are compared
    depth = deepest = 0
    n = 0
    repeated = ask = False
    stops = _STOP_OUTSIDE
    while i < e:
        c = b[i]
        if not stops[c]:
            i += 1
            continue
        if c == 34:  # a string value
            i, _ = _skip_string(b, i, e)
            if i < 0:
                return NOT_UTF8
        elif c == 44 or c == 123:  # , {
            if c == 123:
                depth += 1
                deepest = max(deepest, depth)
                stops = _STOP_NESTED if depth > 1 else _STOP_OUTSIDE
            if top and depth == 1:
                j = _skip(b, i + 1, e)
                if j < e and b[j] == 34:  # a key of the top-level object
                    close, escaped = _skip_string(b, j, e)
                    if close < 0:
                        return NOT_UTF8
                    if repeated:
                        pass
                    elif escaped or n == _MAX_KEYS:
                        ask = True
                    else:
                        for k in range(n):
                            if equal_bytes(b, key_starts[k], key_ends[k], b, j + 1, close):
                                repeated = True
                                break
                        key_starts[n], key_ends[n] = j + 1, close
                        n += 1
                    i = close
        elif c == 125 or c == 93:  # } ]
            depth -= 1
            top = top and depth > 0  # after the object: no more keys
            stops = _STOP_NESTED if depth > 1 else _STOP_OUTSIDE
        elif c == 91:  # [
            depth += 1
            deepest = max(deepest, depth)
            stops = _STOP_NESTED if depth > 1 else _STOP_OUTSIDE
        else:  # 128 or more
            size = _utf8_size(b, i, e)
            if size < 0:
                return NOT_UTF8
            i += size - 1
        i += 1
    if deepest > MAX_DEPTH:
        return TOO_DEEP
    return REPEATED_KEY if repeated else ASK if ask else CLEAN


def json_numbers(text: bytes, count: int) -> Floats | None:
    """The ``count`` numbers of JSON arrays of numbers written one after the other (``[1,2][3]``, as rankings
    keep their scores once msgspec has checked them), or ``None`` if ``text`` holds anything else.

    Numbers in the exact form are read by compiled code; the others (exponents, long digits) by ``float``,
    correctly rounded like msgspec's parser, or, when they are more than one in :data:`_FEW_INEXACT` (scores
    written with every digit of a double), all of them by msgspec at once (a tenth of the time)."""
    values, spans, found = _numbers(np.frombuffer(text, dtype=np.uint8), count)
    if found != count:
        return None
    parse = np.flatnonzero(spans[:, 0] >= 0)
    if parse.shape[0] * _FEW_INEXACT > count:
        try:
            return np.array(_FLOATS.decode(text.replace(b"][", b",")), dtype=np.float64)
        except msgspec.MsgspecError:
            pass
    if parse.shape[0]:
        try:
            values[parse] = [float(text[a:b]) for a, b in spans[parse].tolist()]
        except ValueError:
            return None
    return values


_FLOATS = msgspec.json.Decoder(list[float])
#: :func:`json_numbers` reads every number by msgspec when more than one in this many is not in the exact form.
_FEW_INEXACT = 8


@nb.njit(cache=True, nogil=True)
def _numbers(b: Bytes, count: int) -> tuple[Floats, Ints, int]:  # pragma: no cover  # compiled
    values = np.empty(count, np.float64)
    spans = np.full((count, 2), -1, np.int64)
    e = b.shape[0]
    k = 0
    i = 0
    while i < e:
        c = b[i]
        if c == 91 or c == 93 or c == 44:  # [ ] ,
            i += 1
            continue
        if k == count:
            return values, spans, -1
        j, value, exact = _number(b, i, e)
        if j < 0:  # not read here: the number runs to the next delimiter
            j = i
            while j < e and not (b[j] == 44 or b[j] == 93 or b[j] == 91):
                j += 1
        values[k] = value
        if not exact:
            spans[k, 0], spans[k, 1] = i, j
        k += 1
        i = j
    return values, spans, k
