"""A compiled reader of feedback lines (numba): the plainest feedback events go from JSON bytes to columns.

Four events in five of a typical log are feedback: a flat object of a few short strings and numbers. Decoded
by msgspec, each becomes a Python object that is checked, then read field by field into the join's columns;
that was a quarter of a replay. :func:`scan_lines` reads such lines straight into columns (the bounds of the
request id and the item in the chunk, the kind's code, the grade and the time) and leaves every other line,
and every feedback line it is not sure of, to msgspec and :class:`~stream_eval.events.schema.Validator`.

A line is read here only when the answer cannot differ from msgspec's: an object of keys and scalar values
(JSON white space allowed), keys without escapes, each of ``type``, ``request_id``, ``item``, ``kind``,
``grade`` and ``ts`` at most once, ``"type": "feedback"``, a non-empty request id, strings of valid UTF-8
without escapes or control characters, a kind of the config (``click`` when absent) with a grade or a default
grade, a ``ts`` number. Numbers are read here only in the form where one division is correctly rounded
(at most 15 digits, no exponent: both the digits and the power of ten are exact doubles). Longer decimal
fractions (a time in microseconds) are parsed by Python's ``float``, correctly rounded as msgspec's parser is;
any other number sends the line to msgspec.
"""

from __future__ import annotations

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
#: The keys read, numbered from 1 (0: any other key, whose scalar value is skipped).
_KEYS = (b"type", b"request_id", b"item", b"kind", b"grade", b"ts")
_KEY_TEXT = np.frombuffer(b"".join(_KEYS), dtype=np.uint8)
_KEY_ENDS = np.cumsum([len(k) for k in _KEYS])
_KEY_STARTS = _KEY_ENDS - np.array([len(k) for k in _KEYS])
_FEEDBACK = np.frombuffer(b"feedback", dtype=np.uint8)
_TYPE, _REQUEST_ID, _ITEM, _KIND, _GRADE, _TS = 1, 2, 3, 4, 5, 6
_REQUIRED = (1 << _TYPE) | (1 << _REQUEST_ID) | (1 << _ITEM) | (1 << _TS)


@nb.njit(cache=True, inline="always")
def _space(c: np.uint8) -> bool:  # pragma: no cover  # compiled
    return bool(c == 32 or c == 9 or c == 13 or c == 10)  # JSON white space


@nb.njit(cache=True, inline="always")
def _skip(b: Bytes, i: int, e: int) -> int:  # pragma: no cover  # compiled
    while i < e and _space(b[i]):
        i += 1
    return i


@nb.njit(cache=True)
def _string_end(b: Bytes, i: int, e: int) -> int:  # pragma: no cover  # compiled
    """``b[i]`` is a quote: the index of the closing quote, or -1 if the string has an escape, a control
    character or bytes that are not UTF-8, or does not end on the line."""
    i += 1
    while i < e:
        c = b[i]
        if c == 34:
            return i
        if c == 92 or c < 32:
            return -1
        if c < 128:
            i += 1
            continue
        # UTF-8: the lead byte gives the length and the range of the first continuation byte
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
        i += more + 1
    return -1


@nb.njit(cache=True)
def _number(b: Bytes, i: int, e: int) -> tuple[int, float, bool]:  # pragma: no cover  # compiled
    """A JSON number at ``b[i]``: (the index after it, its value, whether the value is exact), or (-1, 0, False)
    when it is not in a form read here. Numbers with a fraction and more than 15 digits are read (to be
    parsed by the caller) but their value is not exact."""
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
def _feedback_line(b: Bytes, s: int, e: int, kinds: Bytes, kind_starts: Ints, kind_ends: Ints, grades: Floats,
                   click: int, out: Ints, values: Floats) -> bool:  # pragma: no cover  # compiled
    """Read the line ``b[s:e]`` if it is a feedback event in the plain form: ``out`` gets the bounds of the
    request id and the item and the kind's index, ``values`` the grade and the time."""
    i = _skip(b, s, e)
    if i >= e or b[i] != 123:
        return False
    i = _skip(b, i + 1, e)
    seen = 0
    kind = click
    grade = np.nan
    ts = 0.0
    out[5] = out[7] = -1
    while True:
        if i >= e or b[i] != 34:
            return False
        close = _string_end(b, i, e)
        if close < 0:
            return False
        key = 0
        for k in range(_KEY_STARTS.shape[0]):
            if equal_bytes(b, i + 1, close, _KEY_TEXT, _KEY_STARTS[k], _KEY_ENDS[k]):
                key = k + 1
                break
        if key and seen & (1 << key):
            return False  # a repeated key: msgspec decides
        seen |= 1 << key
        i = _skip(b, close + 1, e)
        if i >= e or b[i] != 58:
            return False
        i = _skip(b, i + 1, e)
        if i >= e:
            return False
        c = b[i]
        if c == 34:
            close = _string_end(b, i, e)
            if close < 0:
                return False
            if key == _TYPE:
                if not equal_bytes(b, i + 1, close, _FEEDBACK, 0, _FEEDBACK.shape[0]):
                    return False
            elif key == _REQUEST_ID:
                if close == i + 1:
                    return False  # empty: msgspec rejects it
                out[0], out[1] = i + 1, close
            elif key == _ITEM:
                out[2], out[3] = i + 1, close
            elif key == _KIND:
                kind = -1
                for k in range(kind_starts.shape[0]):
                    if equal_bytes(b, i + 1, close, kinds, kind_starts[k], kind_ends[k]):
                        kind = k
                        break
                if kind < 0:
                    return False
            elif key != 0:
                return False  # a string grade or time
            i = close + 1
        elif c == 45 or 48 <= c <= 57:
            start = i
            i, value, exact = _number(b, i, e)
            if i < 0:
                return False
            if key == _GRADE:
                if c == 45 and not (exact and value == 0):
                    return False  # below 0 (or perhaps): msgspec gives the reason
                grade = value
                if not exact:
                    out[7], out[8] = start, i
            elif key == _TS:
                ts = value
                if not exact:
                    out[5], out[6] = start, i
            elif key != 0:
                return False
        else:
            i, word = _literal(b, i, e)
            if i < 0:
                return False
            if key != 0 and not (key == _GRADE and word == 0):
                return False  # only a null grade (= none) or a literal of another key
        i = _skip(b, i, e)
        if i >= e:
            return False
        if b[i] == 44:
            i = _skip(b, i + 1, e)
            continue
        if b[i] != 125:
            return False
        break
    if _skip(b, i + 1, e) != e or seen & _REQUIRED != _REQUIRED or kind < 0:
        return False
    if grade != grade and out[7] < 0:
        grade = grades[kind]
        if grade != grade:
            return False  # no default grade for this kind: msgspec's path gives the reason
    out[4] = kind
    values[0], values[1] = grade, ts
    return True


def scan_lines(b: Bytes, kinds: Bytes, kind_starts: Ints, kind_ends: Ints, grades: Floats,
               click: int) -> tuple[Ints, Ints, Ints, Floats]:
    """The non-blank lines of ``b`` (blank as ``bytes.strip`` has it) and the feedback among them read here.

    One row per non-blank line: ``lines`` (start, end, line number from 0, blank lines counted), ``fast`` (1 if
    read here), ``fields`` (request id start and end, item start and end, index of the kind in ``kinds``,
    start and end of the time's text and of the grade's when they are to be parsed by the caller, else -1),
    ``values`` (grade, ts). ``click`` is the index of the default kind (-1: none).
    """
    return _scan(b, np.flatnonzero(b == 10), kinds, kind_starts, kind_ends, grades, click)  # numpy finds newlines


@nb.njit(cache=True, nogil=True)
def _scan(b: Bytes, newlines: Ints, kinds: Bytes, kind_starts: Ints, kind_ends: Ints, grades: Floats,
          click: int) -> tuple[Ints, Ints, Ints, Floats]:  # pragma: no cover  # compiled
    n = b.shape[0]
    rows = newlines.shape[0] + 1
    lines = np.empty((rows, 3), np.int64)
    fast = np.zeros(rows, np.int64)
    fields = np.zeros((rows, 9), np.int64)
    values = np.zeros((rows, 2), np.float64)
    k = 0
    i = 0
    for number in range(rows):
        j = newlines[number] if number < newlines.shape[0] else n
        if i >= n:
            break
        blank = True
        for p in range(i, j):
            c = b[p]
            if not (c == 32 or c == 9 or c == 13 or c == 11 or c == 12):
                blank = False
                break
        if not blank:
            lines[k, 0], lines[k, 1], lines[k, 2] = i, j, number
            if _feedback_line(b, i, j, kinds, kind_starts, kind_ends, grades, click, fields[k], values[k]):
                fast[k] = 1
            k += 1
        i = j + 1
    return lines[:k], fast[:k], fields[:k], values[:k]


def json_numbers(text: bytes, count: int) -> Floats | None:
    """The ``count`` numbers of JSON arrays of numbers written one after the other (``[1,2][3]``, as rankings
    keep their scores once msgspec has checked them), or ``None`` if ``text`` holds anything else.

    Numbers in the exact form are read by compiled code; the others (exponents, long digits) by ``float``,
    correctly rounded like msgspec's parser."""
    values, spans, found = _numbers(np.frombuffer(text, dtype=np.uint8), count)
    if found != count:
        return None
    parse = np.flatnonzero(spans[:, 0] >= 0)
    if parse.shape[0]:
        try:
            values[parse] = [float(text[a:b]) for a, b in spans[parse].tolist()]
        except ValueError:
            return None
    return values


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
