"""The per-request output (SPEC §4 ``--per-request``) as a Parquet file: one row per finalised request, with the
record's ids and one float column per metric (null where the JSON record has ``null``)."""

from __future__ import annotations

from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from stream_eval.engine.engine import FinalisedBatch

#: The id columns, in the order of the JSON record's keys.
ID_COLUMNS = ("request_id", "experiment", "arm", "query_id", "session_id")


class ParquetPerRequestWriter:
    """Writes each finalised batch as a row group of ``path`` (the file is complete once closed)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.written = 0
        self._writer: pq.ParquetWriter | None = None

    def __call__(self, batch: FinalisedBatch) -> None:
        states = batch.states
        ids = {
            "request_id": [s.request_id for s in states],
            "experiment": [s.experiment for s in states],
            "arm": [s.arm for s in states],
            "query_id": [s.request_id if s.query_id is None else s.query_id for s in states],
            "session_id": [s.request_id if s.session_id is None else s.session_id for s in states],
        }
        arrays = [pa.array(ids[name], pa.string()) for name in ID_COLUMNS]
        for j in range(len(batch.specs)):
            values = np.ascontiguousarray(batch.values[:, j], dtype=np.float64)
            arrays.append(pa.array(values, pa.float64(), mask=np.isnan(values)))
        table = pa.Table.from_arrays(arrays, names=[*ID_COLUMNS, *(spec.name for spec in batch.specs)])
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, table.schema)
        self._writer.write_table(table)
        self.written += len(states)

    def close(self) -> None:
        """Finish the file; with no request finalised, a file of the id columns and no rows."""
        if self._writer is None:
            pq.write_table(pa.table({name: pa.array([], pa.string()) for name in ID_COLUMNS}), self.path)
            return
        self._writer.close()

    def __enter__(self) -> ParquetPerRequestWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
