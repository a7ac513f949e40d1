"""The scans of a run kept in its attempt's staging, so a rerun that takes the attempt
over plans from them instead of reading every input file again.

    <attempt>/_SCANS.json   {"format": "ballast-scans", "format_version": 2, "version_id": ...}
                            {"t": "arrow-schema", "v": <IPC bytes, base64>}   each schema once
                            {"t": "FileScan", "v": {...}}                     one line a scan
                            {"sha256": <of every line before this one>}

The driver streams the record once the checks across files pass (`store_scans`), one
scan's encoding in memory at a time, written atomically (a rename locally, an upload S3
shows only once complete); a rerun that took over a dead attempt of its version
(preprocessing/versions/attempt.py) loads it with one GET (`load_scans`: no HEAD first,
as on S3 a read would cost two requests). Lines are JSON, every value that JSON does not
tell apart tagged (`{"t": tag, "v": ...}`: tuples, sets, dicts, bytes, numpy arrays,
non-finite floats, the scan's dataclasses by name, from a closed list), so the round trip
is exact and nothing in the file can run code as a pickle would. A pyarrow schema is its
Arrow IPC bytes, each distinct one stored once, before the first scan that names it by
index: the files of a version mostly share one. A record that is absent, damaged (cut
short, so without its end line; not its sha256; not JSON; not the shape written), of
another format version, another version id or other files is not used: the rerun scans
again, saying why. The version id hashes the inputs, every setting that changes a scan
and the code version, so a record of the same id holds the scans a new scan would make.

Cost (benchmarks/scan_record_bench.py, RESULTS.md M43): a few ms for 64 files, about a
second for 10,000; distinct-value sketches dominate where there are string or integer
features (4,096 hashes, 44 KB of base64 a column and file). At 2 GB in 64 files a rerun's
scan stage goes from 1.3-1.5 s to none, but its wall time did not move beyond the noise:
the workers' first imports (0.75 s each), which the scan's tasks paid, fall to the verify
and map tasks.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import hashlib
import json
import logging
import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from fsspec.core import url_to_fs

from preprocessing.plan.counts import Counts
from preprocessing.plan.time_cut import TimeCells
from preprocessing.scan.content_pairs import ContentPairs
from preprocessing.scan.feature_stats import ColumnProfile
from preprocessing.scan.inputs import FileScan
from preprocessing.storage.objects import write_stream_atomically
from preprocessing.storage.sources import InputFile
from preprocessing.toolbox.secrets import redact

log = logging.getLogger(__name__)

SCANS_NAME = "_SCANS.json"
FORMAT = "ballast-scans"
FORMAT_VERSION = 6  # 3: decoded bytes; 4: time cells; 5: pairs; 6: their repeated ids
SCHEMA_LINE = "arrow-schema"  # a body line holding a schema, not a scan
# The dataclasses a record may hold, by name: decoding builds no other class.
RECORD_CLASSES: dict[str, Any] = {
    cls.__name__: cls
    for cls in (FileScan, InputFile, Counts, ColumnProfile, TimeCells, ContentPairs)
}
# Each record class's fields, by name (`dataclasses.fields` per value cost a tenth of a load).
_FIELDS = {name: [f.name for f in dataclasses.fields(cls)] for name, cls in RECORD_CLASSES.items()}
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_PLAIN = (str, bool, int)  # JSON gives these back as they were; `None` too


class RecordError(ValueError):
    """A scan record that cannot be made or used; the message says why."""


def record_lines(scans: Iterable[FileScan], version_id: str) -> Iterator[bytes]:
    """The record of `scans` of version `version_id`, line by line, holding one scan's
    encoding at a time: the header, each schema before the first scan that uses it, the
    scans, and the end line with the sha256 of every line before it."""
    digest = hashlib.sha256()

    def line(value: Any) -> bytes:
        data = json.dumps(value, separators=(",", ":")).encode() + b"\n"
        digest.update(data)
        return data

    yield line({"format": FORMAT, "format_version": FORMAT_VERSION, "version_id": version_id})
    encoder = _Encoder([])
    for scan in scans:
        encoded = encoder.value(scan)
        for schema in encoder.take_new_schemas():
            yield line(_tag(SCHEMA_LINE, _b64(schema)))
        yield line(encoded)
    yield json.dumps({"sha256": digest.hexdigest()}).encode() + b"\n"


def encode_scans(scans: list[FileScan], version_id: str) -> bytes:
    """The whole record of `scans` of version `version_id` (`record_lines` joined)."""
    return b"".join(record_lines(scans, version_id))


def decode_scans(data: bytes, version_id: str) -> list[FileScan]:
    """The scans of a record of version `version_id`; RecordError saying why it is unusable."""
    first, _, _ = data.partition(b"\n")
    try:
        header = json.loads(first)
    except ValueError as error:
        raise RecordError(f"its header is not JSON ({error})") from None
    _check_header(header, version_id)
    end = data.rfind(b"\n", 0, max(len(data) - 1, 0)) + 1  # where the last line starts
    _check_end(data[end:], memoryview(data)[:end])  # a view: no copy of a large record
    try:
        return _decode_body(_lines(data, len(first) + 1, end))
    except RecordError:  # a ValueError, but one that already says why
        raise
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, OSError) as e:
        raise RecordError(
            f"its payload is not a record of scans ({type(e).__name__}: {e})"
        ) from None


def _check_header(header: Any, version_id: str) -> None:
    """Raise RecordError unless the header is of this format, format version and version."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise RecordError(f"it is not a {FORMAT} record")
    found = header.get("format_version")
    if type(found) is not int or found != FORMAT_VERSION:  # `true` is no version 2
        raise RecordError(f"it is of format version {found!r}, not {FORMAT_VERSION}")
    if header.get("version_id") != version_id:
        raise RecordError(f"it is of version {header.get('version_id')!r}, not {version_id}")


def _lines(data: bytes, start: int, stop: int) -> Iterator[bytes]:
    """The lines of `data[start:stop]` (which ends with a newline), one at a time: a
    record is not copied whole."""
    while start < stop:
        newline = data.index(b"\n", start, stop)
        yield data[start:newline]
        start = newline + 1


def _check_end(last_line: bytes, vouched: bytes | memoryview) -> None:
    """Raise RecordError unless `last_line` is an end line whose sha256 is `vouched`'s:
    a record cut short lacks it, a changed one does not hash to it."""
    try:
        end = json.loads(last_line) if last_line.endswith(b"\n") else None
    except ValueError:
        end = None
    digest = hashlib.sha256(vouched).hexdigest()
    if not isinstance(end, dict) or set(end) != {"sha256"} or end["sha256"] != digest:
        raise RecordError("its payload does not hash to its sha256 (cut short or changed)")


def _decode_body(lines: Iterable[bytes]) -> list[FileScan]:
    """The scans of a record's body lines, each schema line adding to the table of schemas
    that the scans after it name by index."""
    schemas: list[pa.Schema] = []
    decoder, scans = _Decoder(schemas), []
    for text in lines:
        value = json.loads(text)
        if isinstance(value, dict) and value.get("t") == SCHEMA_LINE:
            # Arrow raises OSError (or ArrowInvalid, a ValueError) for bytes that are no schema.
            schemas.append(pa.ipc.read_schema(pa.py_buffer(_unb64(value["v"]))))
            continue
        scan = decoder.value(value)
        if not isinstance(scan, FileScan):
            raise RecordError(
                f"its payload is not a list of scans (a line holds a {type(scan).__name__})"
            )
        scans.append(scan)
    return scans


def store_scans(attempt_uri: str, version_id: str, scans: list[FileScan]) -> None:
    """Keep `scans` in the attempt at `attempt_uri` for a rerun, streamed (the driver holds
    one scan's encoding at a time); a record that cannot be written only costs that rerun
    a scan, so it is a warning, not the run's failure."""
    uri = f"{attempt_uri.rstrip('/')}/{SCANS_NAME}"
    try:
        fs, path = url_to_fs(uri)
        write_stream_atomically(fs, path, record_lines(scans, version_id))
    except (OSError, RecordError) as error:
        said = (redact(uri), redact(str(error)))
        log.warning("scan record %s not written (%s): a rerun scans again", *said)


def load_scans(attempt_uri: str, version_id: str, files: list[InputFile]) -> list[FileScan] | None:
    """The scans of `files` kept in the attempt at `attempt_uri`, or None (saying why in
    a warning) when they must be scanned again."""
    uri = f"{attempt_uri.rstrip('/')}/{SCANS_NAME}"
    try:
        fs, path = url_to_fs(uri)
        scans = decode_scans(fs.cat_file(path, start=0), version_id)  # one GET, no HEAD
        if [scan.file for scan in scans] != files:
            raise RecordError("its files are not the ones listed")
    except FileNotFoundError:
        reason = "there is none (the attempt died before its scan ended)"
    except (OSError, RecordError) as error:
        reason = str(error)
    else:
        log.info(
            "scan kept: the scans of %d input file%s", len(scans), "" if len(scans) == 1 else "s"
        )
        return scans
    log.warning("scan record %s not used: %s; scanning again", redact(uri), redact(reason))
    return None


class _Encoder:
    """Values to JSON, tagging what JSON would not give back as it was."""

    def __init__(self, schemas: list[bytes]) -> None:
        self.schemas = schemas
        self._index: dict[bytes, int] = {}
        self._taken = 0

    def value(self, value: Any) -> Any:
        # Exact types: a subclass (an IntEnum, a pandas Timestamp) would come back as its base.
        if value is None or type(value) in (str, bool, int):
            return value
        if type(value) is float:
            return value if math.isfinite(value) else _tag("float", repr(value))
        if type(value) is list:  # a list of plain values (piece rows) as it is: half the calls
            plain = all(item is None or type(item) in _PLAIN for item in value)
            return value if plain else [self.value(item) for item in value]
        if type(value) is tuple:
            return _tag("tuple", [self.value(item) for item in value])
        if type(value) is dict:
            return _tag("dict", [[self.value(k), self.value(v)] for k, v in value.items()])
        if type(value) in (set, frozenset):
            items = sorted((self.value(item) for item in value), key=json.dumps)
            return _tag(type(value).__name__, items)
        return self.tagged(value)

    def tagged(self, value: Any) -> Any:
        """Values of the other types a scan holds, each under its tag."""
        if isinstance(value, pa.Schema):
            return _tag("schema", self.schema_index(value))
        name = type(value).__name__
        if RECORD_CLASSES.get(name) is type(value):
            return _tag(name, {field: self.value(getattr(value, field)) for field in _FIELDS[name]})
        if isinstance(value, np.ndarray | np.generic):
            return _numpy(value)
        if type(value) in (bytes, bytearray):
            return _tag(name, _b64(value))
        if type(value) is decimal.Decimal:
            return _tag("decimal", str(value))
        if type(value) in (datetime.datetime, datetime.date, datetime.time):
            return _tag(name, value.isoformat())
        if type(value) is datetime.timedelta:
            return _tag("timedelta", [value.days, value.seconds, value.microseconds])
        raise RecordError(f"a scan holds a {type(value).__name__}, which a record cannot hold")

    def take_new_schemas(self) -> list[bytes]:
        """The schemas added since the last call, in index order."""
        new, self._taken = self.schemas[self._taken :], len(self.schemas)
        return new

    def schema_index(self, schema: pa.Schema) -> int:
        """The index of `schema` in the record's table of schemas, added once."""
        data = schema.serialize().to_pybytes()
        if data not in self._index:
            self._index[data] = len(self.schemas)
            self.schemas.append(data)
        return self._index[data]


def _numpy(value: np.ndarray | np.generic) -> dict[str, Any]:
    """An array or numpy scalar as its dtype, shape and bytes (plain dtypes only: an
    object dtype would pickle)."""
    if value.dtype.hasobject or value.dtype.names is not None:
        raise RecordError(f"a scan holds a numpy {value.dtype} value, which a record cannot hold")
    array = np.ascontiguousarray(value)
    described = {
        "dtype": array.dtype.str,
        "shape": list(array.shape),
        "data": _b64(array.tobytes()),
    }
    return _tag("ndarray" if isinstance(value, np.ndarray) else "npscalar", described)


class _Decoder:
    """JSON back to the values `_Encoder` tagged."""

    def __init__(self, schemas: list[pa.Schema]) -> None:
        self.schemas = schemas

    def value(self, value: Any) -> Any:
        if value is None or isinstance(value, (str, bool, int, float)):
            return value
        if isinstance(value, list):
            plain = all(item is None or type(item) in _PLAIN for item in value)
            return value if plain else [self.value(item) for item in value]
        if not isinstance(value, dict) or set(value) != {"t", "v"}:
            raise RecordError(f"an untagged JSON object {str(value)[:80]!r}")
        return self.tagged(value["t"], value["v"])

    def tagged(self, tag: str, value: Any) -> Any:
        if tag in RECORD_CLASSES:
            return self.record_class(tag, value)
        if tag in ("tuple", "set", "frozenset"):
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](
                self.value(item) for item in value
            )
        if tag == "dict":
            return {self.value(k): self.value(v) for k, v in value}
        if tag == "schema":
            return self.schemas[_int(value)]
        return _plain(tag, value)

    def record_class(self, name: str, fields: dict[str, Any]) -> Any:
        """An instance of RECORD_CLASSES[name] from exactly its fields."""
        if not isinstance(fields, dict) or set(fields) != set(_FIELDS[name]):
            raise RecordError(f"a {name} with fields {sorted(fields)[:20]}")
        return RECORD_CLASSES[name](**{key: self.value(item) for key, item in fields.items()})


def _plain(tag: str, value: Any) -> Any:
    """The tagged values that hold no other value."""
    if tag == "float":
        return _NON_FINITE[value]
    if tag in ("bytes", "bytearray"):
        return (bytes if tag == "bytes" else bytearray)(_unb64(value))
    if tag in ("ndarray", "npscalar"):
        dtype = np.dtype(str(value["dtype"]))
        if dtype.hasobject or dtype.names is not None:
            raise RecordError(f"a numpy {dtype} value")
        array = np.frombuffer(_unb64(value["data"]), dtype=dtype).reshape(value["shape"])
        return array.copy() if tag == "ndarray" else array[()]
    if tag == "decimal":
        return decimal.Decimal(value)
    if tag in ("datetime", "date", "time"):
        kind: dict[str, Any] = {
            "datetime": datetime.datetime,
            "date": datetime.date,
            "time": datetime.time,
        }
        return kind[tag].fromisoformat(value)
    if tag == "timedelta":
        days, seconds, microseconds = value
        return datetime.timedelta(days, seconds, microseconds)
    raise RecordError(f"an unknown tag {str(tag)[:40]!r}")


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RecordError(f"{value!r} is not an index")
    return value


def _tag(tag: str, value: Any) -> dict[str, Any]:
    return {"t": tag, "v": value}


def _b64(data: bytes | bytearray) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)
