"""The per-request output (docs/contract.md §4 ``--per-request``) as a Parquet file: one row per finalised
request, with the record's ids and one float column per metric (null where the JSON record has ``null``)."""

from __future__ import annotations

from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from stream_eval.engine.engine import ID_FIELDS, FinalisedBatch


class ParquetPerRequestWriter:
    """Writes each finalised batch as a row group of ``path`` (the file is complete once closed)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.written = 0
        self._writer: pq.ParquetWriter | None = None

    def __call__(self, batch: FinalisedBatch) -> None:
        columns = list(zip(*batch.ids(), strict=True)) or [()] * len(ID_FIELDS)
        arrays = [pa.array(column, pa.string()) for column in columns]
        for j in range(len(batch.specs)):
            values = np.ascontiguousarray(batch.values[:, j], dtype=np.float64)
            arrays.append(pa.array(values, pa.float64(), mask=np.isnan(values)))
        table = pa.Table.from_arrays(arrays, names=[*ID_FIELDS, *(spec.name for spec in batch.specs)])
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, table.schema)
        self._writer.write_table(table)
        self.written += len(batch.states)

    def close(self) -> None:
        """Finish the file; with no request finalised, a file of the id columns and no rows."""
        if self._writer is None:
            pq.write_table(pa.table({name: pa.array([], pa.string()) for name in ID_FIELDS}), self.path)
            return
        self._writer.close()

    def __enter__(self) -> ParquetPerRequestWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
