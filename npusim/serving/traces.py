"""Request trace files: read (and write) the Mooncake JSONL format and a simple CSV.

**Mooncake JSONL** (``.jsonl``; the format of kvcache-ai/Mooncake ``FAST25-release/traces``): one
JSON object per line with exactly these keys:

- ``timestamp``: arrival time in milliseconds from the start of the trace (number >= 0);
- ``input_length``, ``output_length``: prompt and generated tokens (integers >= 1);
- ``hash_ids`` (optional): list of integers >= 0, one per 512-token prompt block
  (``ceil(input_length / 512)`` of them); equal ids at the same position = reusable prefix.

**CSV** (``.csv``): a header row, then one request per row. Columns: ``arrival_s`` *or*
``arrival_ms`` (number >= 0), ``input_tokens`` and ``output_tokens`` (integers >= 1), in any order.
Lines whose first non-blank character is ``#`` are comments.

Strictness: nothing is silently skipped. An empty line, invalid JSON, a missing, unknown,
duplicated or wrongly typed field, a negative or zero length, a wrong field count in a CSV row:
each raises :class:`~npusim.errors.ConfigError` naming the file and the 1-based line, e.g.
``traces/x.jsonl line 17: 'output_length' must be a positive integer, got -3``. Timestamps need
not be monotonic; requests are sorted by arrival time (ties keep file order).

Request ids are the 0-based position of the request among the file's data lines (so JSONL line =
id + 1 when there are no comments), kept through ``first``/``window``/``scale``; call
:func:`npusim.serving.requests.renumber` for ids 0..n-1.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path

from npusim.errors import ConfigError
from npusim.files import atomic_path, read_text
from npusim.serving.requests import (BLOCK_TOKENS, Request, _sorted, blocks_for, scale_arrivals, take_first,
                                     time_window)

MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
CSV_ARRIVAL_COLUMNS = {"arrival_s": 1.0, "arrival_ms": 1e-3}  # column -> seconds per unit
CSV_LENGTH_COLUMNS = ("input_tokens", "output_tokens")
FORMATS = {".jsonl": "mooncake", ".csv": "csv"}


class _LineError(Exception):
    """A problem with one line; the caller adds the file and line number."""


def _numbered_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its newline); a final newline does not make a line."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, start=1):
        yield number, line.removesuffix("\r")


def _positive_int(value, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _LineError(f"{key!r} must be a positive integer, got {json.dumps(value)}")
    return value


def _timestamp(value, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise _LineError(f"{key!r} must be a number >= 0, got {json.dumps(value)}")
    return float(value)


def _hash_ids(value, input_length: int) -> tuple[int, ...]:
    if not isinstance(value, list) or any(isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in value):
        raise _LineError(f"'hash_ids' must be a list of integers >= 0, got {json.dumps(value)[:80]}")
    if len(value) != blocks_for(input_length):
        raise _LineError(f"'hash_ids' has {len(value)} entries but input_length {input_length} needs "
                         f"{blocks_for(input_length)} (one per {BLOCK_TOKENS}-token block)")
    return tuple(value)


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise _LineError(f"key {key!r} appears twice")
        seen[key] = value
    return seen


def _reject_constant(name: str):
    raise _LineError(f"{name} is not a valid number")


def _mooncake_request(line: str, rid: int) -> Request:
    if not line.strip():
        raise _LineError("empty line (every line must hold one JSON object; remove blank lines)")
    try:
        obj = json.loads(line, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise _LineError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise _LineError(f"expected a JSON object, got {type(obj).__name__}")
    unknown = [k for k in obj if k not in MOONCAKE_KEYS]
    if unknown:
        raise _LineError(f"unknown key {unknown[0]!r}; the keys are {', '.join(MOONCAKE_KEYS)}")
    missing = [k for k in MOONCAKE_KEYS[:3] if k not in obj]
    if missing:
        raise _LineError(f"missing key {missing[0]!r} (each line needs timestamp, input_length, "
                         "output_length; hash_ids is optional)")
    arrival_s = _timestamp(obj["timestamp"], "timestamp") / 1000.0
    input_length = _positive_int(obj["input_length"], "input_length")
    output_length = _positive_int(obj["output_length"], "output_length")
    hashes = _hash_ids(obj["hash_ids"], input_length) if "hash_ids" in obj else ()
    return Request(rid, arrival_s, input_length, output_length, hashes)


def parse_mooncake(lines: Iterable[str], source: str = "<trace>") -> list[Request]:
    """Parse Mooncake JSONL lines (without newlines); ``source`` names the file in errors."""
    reqs = []
    for number, line in enumerate(lines, start=1):
        try:
            reqs.append(_mooncake_request(line, len(reqs)))
        except (_LineError, ConfigError) as exc:
            raise ConfigError(f"{source} line {number}: {exc}") from None
    return _sorted(reqs)


def _csv_header(fields: list[str]) -> tuple[int, float, int, int]:
    """Column positions (arrival, input, output) and the arrival unit in seconds."""
    names = [f.strip() for f in fields]
    known = (*CSV_ARRIVAL_COLUMNS, *CSV_LENGTH_COLUMNS)
    expected = "expected a header with arrival_s (or arrival_ms), input_tokens, output_tokens"
    for name in names:
        if name not in known:
            raise _LineError(f"unknown column {name!r}; {expected}")
        if names.count(name) > 1:
            raise _LineError(f"column {name!r} appears twice")
    arrivals = [n for n in names if n in CSV_ARRIVAL_COLUMNS]
    if len(arrivals) != 1:
        raise _LineError(f"{'both arrival_s and arrival_ms' if arrivals else 'no arrival column'}; {expected}")
    for name in CSV_LENGTH_COLUMNS:
        if name not in names:
            raise _LineError(f"missing column {name!r}; {expected}")
    return (names.index(arrivals[0]), CSV_ARRIVAL_COLUMNS[arrivals[0]],
            names.index("input_tokens"), names.index("output_tokens"))


def _csv_int(text: str, column: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise _LineError(f"{column!r} must be a positive integer, got {text.strip()!r}") from None
    if value < 1:
        raise _LineError(f"{column!r} must be a positive integer, got {value}")
    return value


def _csv_arrival(text: str, column: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise _LineError(f"{column!r} must be a number >= 0, got {text.strip()!r}")
    return value


def parse_csv(lines: Iterable[str], source: str = "<trace>") -> list[Request]:
    """Parse CSV trace lines (without newlines); ``source`` names the file in errors."""
    header = None
    names: list[str] = []
    reqs: list[Request] = []
    for number, line in enumerate(lines, start=1):
        try:
            if line.lstrip().startswith("#"):
                continue
            if not line.strip():
                raise _LineError("empty line (remove blank lines; '#' starts a comment)")
            fields = next(csv.reader([line]))
            if header is None:
                header = _csv_header(fields)
                names = [f.strip() for f in fields]
                continue
            if len(fields) != len(names):
                raise _LineError(f"expected {len(names)} fields ({','.join(names)}), got {len(fields)}")
            a_col, unit_s, i_col, o_col = header
            arrival_s = _csv_arrival(fields[a_col], names[a_col]) * unit_s
            reqs.append(Request(len(reqs), arrival_s, _csv_int(fields[i_col], "input_tokens"),
                                _csv_int(fields[o_col], "output_tokens")))
        except (_LineError, ConfigError, csv.Error) as exc:
            raise ConfigError(f"{source} line {number}: {exc}") from None
    if header is None:
        raise ConfigError(f"{source}: no header row; expected arrival_s (or arrival_ms),input_tokens,output_tokens")
    return _sorted(reqs)


def trace_format(path: str | Path, fmt: str | None = None) -> str:
    """The format name of a trace: ``fmt`` if given, else from the extension."""
    if fmt is not None:
        if fmt not in FORMATS.values():
            raise ConfigError(f"{path}: trace format must be one of {sorted(set(FORMATS.values()))}, got {fmt!r}")
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ConfigError(f"{path}: cannot tell the trace format from the extension {suffix!r}; "
                          "use .jsonl (Mooncake) or .csv, or pass fmt='mooncake'|'csv'")
    return FORMATS[suffix]


def load_trace(path: str | Path, fmt: str | None = None, first: int | None = None,
               window: tuple[float, float | None] | None = None, scale: float = 1.0) -> list[Request]:
    """Read a request trace and apply the options, in this order:

    1. parse the whole file (format from ``fmt`` or the extension; every line is checked);
    2. ``window=(start_s, end_s)``: keep arrivals in ``[start_s, end_s)`` of the trace's own
       time, re-based to start at 0 (``end_s=None``: to the end);
    3. ``first=n``: keep the ``n`` earliest of those;
    4. ``scale``: multiply arrival times by ``scale`` (0.5 = twice the request rate).

    Returns requests sorted by arrival; ids as described in the module docstring.
    An empty file or a selection with no requests is a :class:`ConfigError`.
    """
    path = Path(path)
    kind = trace_format(path, fmt)
    lines = list(_numbered_lines(read_text(path, "a .jsonl or .csv trace", missing="no such trace file")))
    parser = parse_mooncake if kind == "mooncake" else parse_csv
    reqs = parser((line for _, line in lines), str(path))
    if not reqs:
        raise ConfigError(f"{path}: the trace holds no requests")
    span = f"the trace's arrivals span {reqs[0].arrival_s:g}..{reqs[-1].arrival_s:g} s"
    if window is not None:
        try:
            start_s, end_s = window
        except (TypeError, ValueError):
            raise ConfigError(f"window must be (start_s, end_s), got {window!r}") from None
        reqs = time_window(reqs, start_s, end_s)
        if not reqs:
            raise ConfigError(f"{path}: window [{start_s}, {end_s}) s selects no requests; {span}")
    if first is not None:
        reqs = take_first(reqs, first)
        if not reqs:
            raise ConfigError(f"{path}: first={first} selects no requests")
    if scale != 1.0:
        reqs = scale_arrivals(reqs, scale)
    return reqs


def _ms(arrival_s: float) -> int | float:
    """Seconds -> milliseconds rounded to the nanosecond (so 1.234 s is 1234, not 1234.0000000000002)."""
    ms = round(arrival_s * 1000.0, 6)
    return int(ms) if ms.is_integer() else ms


def write_trace(path: str | Path, reqs: Iterable[Request], fmt: str | None = None) -> Path:
    """Write requests as a trace file (atomically), sorted by arrival.

    Mooncake JSONL stores ``timestamp`` in ms rounded to the nanosecond (an integer when whole)
    and ``hash_ids`` when the request has them; CSV stores ``arrival_s,input_tokens,output_tokens``
    (no hashes). Reading the file back gives the same lengths and hashes, and the same arrivals
    up to that rounding.
    """
    kind = trace_format(path, fmt)
    ordered = _sorted(reqs)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        if kind == "mooncake":
            for r in ordered:
                obj = {"timestamp": _ms(r.arrival_s), "input_length": r.input_len, "output_length": r.output_len}
                if r.hash_ids:
                    obj["hash_ids"] = list(r.hash_ids)
                f.write(json.dumps(obj) + "\n")
        else:
            f.write("arrival_s,input_tokens,output_tokens\n")
            for r in ordered:
                f.write(f"{r.arrival_s!r},{r.input_len},{r.output_len}\n")
    return Path(path)
