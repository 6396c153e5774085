"""Arrow record batches as PostgreSQL binary COPY data, column by column as planned.

Each column is brought to its wire type in Arrow (:mod:`~txsink.connectors.postgres.casts`
chose it at the check), then ``pgpq`` encodes the whole batch in one call. A value that
cannot reach its wire type (NaN into numeric, a long into an int column that changed,
text that is not a uuid) is a :class:`~txsink.errors.WriteError` naming its row and
column, raised before a byte of the batch is sent. Values the server refuses (too long
for ``varchar(n)``, out of range for ``numeric(p,s)``, NULL into NOT NULL) come back
from the COPY with the row and column the server names (see ``errors.py``).

The only values converted one by one in Python: nested values into JSON text, and text
into ``uuid`` / ``inet`` / ``cidr`` (Arrow has no parser for them).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txsink.connectors.postgres.casts import ColumnPlan
from txsink.errors import WriteError
from txsink.kit.jsonrows import json_default

__all__ = ["BinaryEncoder"]

_AFTER = "; nothing of this epoch was committed"
_CAST_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)


class BinaryEncoder:
    """Binary COPY data for batches of the planned columns: :meth:`header`, then
    :meth:`encode` for each batch, then :meth:`finish`."""

    def __init__(self, plans: Sequence[ColumnPlan]) -> None:
        from pgpq import ArrowToPostgresBinaryEncoder
        from pgpq.encoders import StringEncoderBuilder
        from pgpq.schema import Jsonb

        self.plans = list(plans)
        self.schema = pa.schema([pa.field(p.name, p.wire) for p in self.plans])
        encoders: dict[str, Any] = {}
        for plan, field in zip(self.plans, self.schema, strict=True):
            if plan.jsonb:
                encoders[field.name] = StringEncoderBuilder.new_with_output(field, Jsonb())
            else:
                encoders[field.name] = ArrowToPostgresBinaryEncoder.infer_encoder(field)
        self._encoder = ArrowToPostgresBinaryEncoder.new_with_encoders(self.schema, encoders)

    def header(self) -> bytes:
        return self._encoder.write_header()

    def finish(self) -> bytes:
        return self._encoder.finish()

    def encode(self, batch: pa.RecordBatch, first_row: int) -> bytes:
        """``batch`` (rows ``first_row``... of the transaction) as COPY data."""
        arrays = [_convert(batch.column(plan.name), plan, first_row) for plan in self.plans]
        wire = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        return self._encoder.write_batch(wire)


def _convert(column: pa.Array, plan: ColumnPlan, first_row: int) -> pa.Array:
    if plan.how == "json":
        return _json_text(column, plan, first_row)
    if plan.how == "uuid":
        return _uuids(column, plan, first_row)
    if plan.how in ("inet", "cidr"):
        return _each(column, plan, first_row, lambda v: _inet(v, cidr=plan.how == "cidr"))
    if column.type == plan.wire:
        return column
    if pa.types.is_null(column.type):
        return pa.nulls(len(column), plan.wire)
    cast = _cast(plan)
    try:
        return cast(column)
    except _CAST_ERRORS as err:
        row = _first_bad(column, cast)
        raise _bad(plan, first_row + row, column[row].as_py(), str(err)) from err


def _cast(plan: ColumnPlan) -> Callable[[pa.Array], pa.Array]:
    if pa.types.is_floating(plan.source) and pa.types.is_decimal(plan.wire):
        # Through the float's shortest decimal text, as COPY's text form did: 0.1 -> 0.1,
        # not float32's exact 0.100000001490116...; NaN and Infinity are refused here.
        return lambda a: a.cast(pa.string()).cast(plan.wire)
    return lambda a: a.cast(plan.wire)


def _first_bad(column: pa.Array, convert: Callable[[pa.Array], Any]) -> int:
    """The first row of ``column`` that ``convert`` fails on (it fails on the whole)."""
    lo, hi = 0, len(column)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            convert(column.slice(lo, mid - lo))
        except _CAST_ERRORS:
            hi = mid
        else:
            lo = mid
    return lo


def _bad(plan: ColumnPlan, row: int, value: Any, why: str) -> WriteError:
    return WriteError(
        f"column {plan.name!r}: {_short(value)} cannot be {plan.target} ({why}). "
        "Fix or filter the offending "
        f"rows (or cast the column in Spark) and restart the query{_AFTER}",
        row=row,
        column=plan.name,
        phase="write",
    )


def _short(value: Any) -> str:
    """A rejected value as the message shows it (the row is named by its key beside it)."""
    text = repr(value)
    return text if len(text) <= 100 else text[:99] + "…"


def _plain(value: Any, t: pa.DataType) -> Any:
    """A value of Arrow type ``t`` as JSON-ready Python: maps become objects."""
    if value is None:
        return None
    if pa.types.is_map(t):
        return {str(k): _plain(v, t.item_type) for k, v in value}
    if pa.types.is_struct(t):
        return {f.name: _plain(value[f.name], f.type) for f in t}
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return [_plain(v, t.value_type) for v in value]
    return value


def _json_text(column: pa.Array, plan: ColumnPlan, first_row: int) -> pa.Array:
    def dumps(value: Any) -> str:
        try:
            return json.dumps(
                _plain(value, column.type),
                default=json_default,
                allow_nan=False,
                separators=(",", ":"),
            )
        except ValueError as err:  # NaN / Infinity: not JSON
            raise ValueError(f"has no JSON form ({err}): replace NaN and Infinity") from err

    return _each(column, plan, first_row, dumps, pa.string())


def _each(
    column: pa.Array,
    plan: ColumnPlan,
    first_row: int,
    convert: Callable[[Any], Any],
    out: pa.DataType | None = None,
) -> pa.Array:
    values = column.to_pylist()
    done: list[Any] = []
    for i, value in enumerate(values):
        try:
            done.append(None if value is None else convert(value))
        except (ValueError, TypeError) as err:
            raise _bad(plan, first_row + i, value, str(err)) from err
    return pa.array(done, out or plan.wire)


def _inet(text: str, *, cidr: bool) -> bytes:
    """inet / cidr in PostgreSQL's binary form: family, bits, is_cidr, length, address."""
    if cidr:
        net = ipaddress.ip_network(text.strip(), strict=True)
        address, bits = net.network_address, net.prefixlen
    else:
        iface = ipaddress.ip_interface(text.strip())
        address, bits = iface.ip, iface.network.prefixlen
    raw = address.packed
    family = 2 if address.version == 4 else 3  # PGSQL_AF_INET, PGSQL_AF_INET6
    return bytes([family, bits, int(cidr), len(raw)]) + raw


def _uuids(column: pa.Array, plan: ColumnPlan, first_row: int) -> pa.Array:
    """uuid text (any case, with or without hyphens and braces) as its 16 bytes."""
    hexes = pc.replace_substring_regex(column, r"[{}-]", "")
    ok = pc.fill_null(pc.match_substring_regex(hexes, r"^[0-9a-fA-F]{32}$"), True)
    if not pc.all(ok).as_py():
        row = int(pc.index(ok, False).as_py())
        raise _bad(plan, first_row + row, column[row].as_py(), "not a uuid")
    return pa.array(
        [None if h is None else bytes.fromhex(h) for h in hexes.to_pylist()], pa.binary()
    )
