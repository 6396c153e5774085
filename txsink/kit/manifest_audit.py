"""The audit of an output that commits each epoch with a manifest (:mod:`txsink.kit.manifests`).

Shared by the sinks whose epochs are data files (or objects) named by an epoch manifest;
each gives its storage's means as an :class:`Output`, this module judges nothing (the core
compares, :mod:`txsink.ops.audit`) but says what it found, per requested epoch:

* metadata (always): the epoch's manifest exists, was written by this app, and lists the
  files the decision's handles name, no more, no fewer; every file it lists exists with
  its recorded size (one stat per file); the rows are counted from each Parquet file's
  footer (a footer read, not the data), and a footer that disagrees with the manifest is
  a problem. Text formats keep no count: their rows are the manifest's, at this level.
* deep: each listed file's rows are read, cast back to the epoch's written schema where
  the format changed their spelling, and digested (:func:`txsink.audit.digest.digest_rows`);
  the output may check more (a content hash) per file.
* extras: one listing of the audited epochs' folders and of the output's top level; a
  data file there that neither a manifest nor a decision of the audited epochs names is
  an extra, unless its name is another sink uid's (``<uid>-p<nnnnn>-<nnnn>.<ext>``) or
  hidden (``_`` or ``.`` first, skipped by Spark and Hive as well). A manifest of an
  epoch where the decision gave the sink no rows is an extra too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from txsink.audit.digest import digest_rows
from txsink.audit.found import AuditRequest, EpochFound, EpochToAudit, Extra, TargetAudit
from txsink.errors import TxsinkError
from txsink.handles import Handle
from txsink.kit import evolving, manifests

__all__ = ["Output", "Stored", "audit_manifests", "in_audited_folders", "written_schema"]

#: A data file named by a txsink sink: ``<uid>-p<partition:05d>-<seq:04d>.<ext>``.
_OURS = re.compile(r"^(?P<uid>.+)-p\d{5}-\d{4}\.[^/]+$")


@dataclass(frozen=True)
class Stored:
    """A data file as the storage reports it (a stat, a HEAD or a listing): its size and,
    where the storage keeps one, its content tag (an S3-style ETag, without quotes)."""

    size: int
    tag: str = ""


class Output(Protocol):
    """One sink's output, as its audit reads it; names are relative to the output."""

    uid: str
    #: The manifests' list of files (``"files"``, ``"objects"``) and an entry's name field.
    listing: str
    name_field: str

    def where(self, name: str) -> str:
        """``name`` for people: a path or a URL."""
        ...

    def manifest(self, epoch: int) -> dict[str, Any] | None:
        """The epoch's manifest of this uid, or None if there is none."""
        ...

    def decided(self, handle: Handle) -> list[str]:
        """The data files a decided handle publishes."""
        ...

    def stat(self, name: str) -> Stored | None:
        """The stored file (None: it does not exist)."""
        ...

    def check(self, entry: Mapping[str, Any], stored: Stored) -> str | None:
        """A metadata check of one listed file beyond its size (None: fine)."""
        ...

    def footer_rows(self, name: str, stored: Stored) -> int:
        """The rows a Parquet file's footer records (reads only the footer)."""
        ...

    def list_data(self, epochs: Sequence[int]) -> list[str]:
        """The files of the audited epochs' folders and of the output's top level."""
        ...

    def read(self, doc: Mapping[str, Any], entry: Mapping[str, Any]) -> pa.Table:
        """Deep: the rows of one listed file, as a reader of the output gets them."""
        ...

    def verify(self, entry: Mapping[str, Any]) -> str | None:
        """Deep: a content check of one listed file (None: fine)."""
        ...

    def notes(self) -> list[str]:
        """What this output's audit cannot see."""
        ...


def audit_manifests(request: AuditRequest, out: Output) -> TargetAudit:
    """The answer to ``request`` for the manifest output ``out`` (see the module)."""
    answer = TargetAudit(notes=_notes(out))
    named: set[str] = set()
    for epoch in request.epochs:
        found = _epoch(request, epoch, out, named, answer.extras)
        if found is not None:
            answer.epochs[epoch.epoch] = found
    audited = [e.epoch for e in request.epochs]
    for name in out.list_data(audited):
        if name in named or not in_audited_folders(name, audited):
            continue
        match = _OURS.match(name.rsplit("/", 1)[-1])
        if match is not None and match["uid"] != out.uid:
            continue  # another sink's file, under its own manifests
        answer.extras.append(
            Extra(
                f"{out.where(name)}: a data file that no manifest or decision of the audited "
                "epochs names (a reader of the folder reads it)",
                epoch=_epoch_of(name),
            )
        )
    return answer


def _epoch(
    request: AuditRequest,
    epoch: EpochToAudit,
    out: Output,
    named: set[str],
    extras: list[Extra],
) -> EpochFound | None:
    decided = {n for h in epoch.handles for n in out.decided(h)}
    named |= decided
    where = out.where(manifests.key(out.uid, epoch.epoch))
    doc = out.manifest(epoch.epoch)
    if doc is None:
        if not epoch.handles:
            return None
        return EpochFound(
            rows=0,
            problems=[
                f"the manifest {where} of epoch {epoch.epoch} is missing: a reader that "
                f"follows the manifests sees none of the epoch's {len(decided)} data file(s)"
            ],
            how="looked for the epoch's manifest",
        )
    entries: list[Mapping[str, Any]] = list(doc.get(out.listing) or [])
    listed = {str(e[out.name_field]) for e in entries}
    named |= listed
    if not epoch.handles:
        if entries:
            rows = sum(int(e.get("rows", 0)) for e in entries)
            extras.append(
                Extra(
                    f"the manifest {where} lists {len(entries)} data file(s) of epoch "
                    f"{epoch.epoch}, where the decision gave this sink no rows",
                    epoch=epoch.epoch,
                    rows=rows,
                )
            )
        return None
    problems = _manifest_problems(
        request, doc, where=where, decided=decided, listed=listed, out=out
    )
    rows, present = _metadata(doc, entries, out, problems)
    found = EpochFound(rows=rows, problems=problems, how=_how(doc, request.deep))
    if request.deep:
        tables = []
        for entry in present:
            problem = out.verify(entry)
            if problem is not None:
                problems.append(problem)
            try:
                tables.append(out.read(doc, entry))
            except TxsinkError:
                raise
            except Exception as err:
                where = out.where(str(entry[out.name_field]))
                problems.append(f"data file {where} cannot be read: {err}")
        found.digest = digest_rows(cast_to(t, written_schema(epoch)) for t in tables)
        found.rows = sum(len(t) for t in tables)
    return found


def _manifest_problems(
    request: AuditRequest,
    doc: Mapping[str, Any],
    *,
    where: str,
    decided: set[str],
    listed: set[str],
    out: Output,
) -> list[str]:
    problems = []
    app = doc.get("app_id")
    if app is not None and app != request.app_id:
        problems.append(f"the manifest {where} was written by app {app!r}, not {request.app_id!r}")
    problems += [
        f"the manifest {where} does not list {out.where(n)}, which the decision names"
        for n in sorted(decided - listed)
    ]
    problems += [
        f"the manifest {where} lists {out.where(n)}, which no decided handle names"
        for n in sorted(listed - decided)
    ]
    return problems


def _metadata(
    doc: Mapping[str, Any], entries: Iterable[Mapping[str, Any]], out: Output, problems: list[str]
) -> tuple[int, list[Mapping[str, Any]]]:
    """The epoch's rows by its files' footers (the manifest's count for text formats), and
    the listed files that exist; a missing file, another size or count is a problem."""
    rows = 0
    present = []
    for entry in entries:
        name = str(entry[out.name_field])
        recorded = int(entry.get("rows", 0))
        stored = out.stat(name)
        if stored is None:
            problems.append(
                f"data file {out.where(name)} is missing (the manifest lists it with "
                f"{recorded} rows)"
            )
            continue
        present.append(entry)
        size = entry.get("bytes")
        if size is not None and int(size) != stored.size:
            problems.append(
                f"data file {out.where(name)} is {stored.size} bytes, the manifest "
                f"recorded {int(size)}"
            )
        problem = out.check(entry, stored)
        if problem is not None:
            problems.append(problem)
        if doc.get("format") != "parquet":
            rows += recorded
            continue
        try:
            counted = out.footer_rows(name, stored)
        except TxsinkError:
            raise  # the storage did not answer: not audited, said so
        except Exception as err:
            problems.append(f"data file {out.where(name)} has no readable Parquet footer: {err}")
            continue
        if counted != recorded:
            problems.append(
                f"data file {out.where(name)} holds {counted} rows by its footer, the "
                f"manifest recorded {recorded}"
            )
        rows += counted
    return rows, present


def _how(doc: Mapping[str, Any], deep: bool) -> str:
    counts = "Parquet footers" if doc.get("format") == "parquet" else "the manifest"
    how = f"the epoch's manifest, its data files' sizes, rows by {counts}"
    return how + ("; every listed file read and digested" if deep else "")


def _notes(out: Output) -> list[str]:
    return [
        "metadata: rows are counted from the Parquet footers (JSON lines and CSV keep no "
        "count: the manifest's is used); the rows themselves are read only by a deep audit",
        "extras: only the audited epochs' folders (epoch=<e>) and the output's top level are "
        "listed; a file there that no manifest or decision of those epochs names is reported "
        "unless its name is another sink uid's (<uid>-p<nnnnn>-<nnnn>.<ext>) or hidden "
        "('_' or '.' first); files in other folders, and other sinks' files, are not looked at",
        *out.notes(),
    ]


def in_audited_folders(name: str, epochs: Iterable[int]) -> bool:
    """Whether ``name`` (relative to the output) is a visible file in one of the ``epochs``'
    folders (``epoch=<e>``, under Hive folders or not) or at the output's top level."""
    parts = name.split("/")
    if any(p.startswith(("_", ".")) for p in parts):
        return False
    epoch = _epoch_of(name)
    return len(parts) == 1 if epoch is None else epoch in set(epochs)


def _epoch_of(name: str) -> int | None:
    for part in name.split("/")[:-1]:
        if part.startswith("epoch=") and part[6:].isdigit():
            return int(part[6:])
    return None


def written_schema(epoch: EpochToAudit) -> pa.Schema | None:
    """The schema the epoch's tasks wrote (its handles' ``schema``; None if none says)."""
    for handle in epoch.handles:
        text = getattr(handle, "schema", "")
        if isinstance(text, str) and text:
            return evolving.decode_schema(text)
    return None


def cast_to(table: pa.Table, schema: pa.Schema | None) -> pa.Table:
    """``table``'s columns cast to ``schema``'s types where they differ (a text format's
    strings, a Hive folder's value); a column that cannot be cast is left as read, and its
    digest will differ rather than hide a difference."""
    if schema is None:
        return table
    for field in schema:
        at = table.schema.get_field_index(field.name)
        if at < 0 or table.schema.field(at).type == field.type:
            continue
        try:
            column = table.column(at).cast(field.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        table = table.set_column(at, field.name, column)
    return table
