"""The per-request output (docs/contract.md §4 ``--per-request``) as a Parquet file: one row per finalised
request, with the record's ids and one float column per metric (null where the JSON record has ``null``)."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from stream_eval.engine.engine import ID_FIELDS, FinalisedBatch


class ParquetPerRequestWriter:
    """Writes each finalised batch as a row group of ``path`` (the file is complete once closed)."""

    def __init__(self, path: str, metrics: Sequence[str] = ()) -> None:
        """``metrics``: the metric columns a file with no request finalised still has (the batches' otherwise)."""
        self.path = path
        self.metrics = list(metrics)
        self.written = 0
        self._writer: pq.ParquetWriter | None = None

    def __call__(self, batch: FinalisedBatch) -> None:
        columns = batch.id_columns()
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
        """Finish the file; with no request finalised, a file of the id and metric columns and no rows (the same
        schema as a file with rows, so that files of several runs read as one dataset)."""
        if self._writer is None:
            pq.write_table(pa.table({**{name: pa.array([], pa.string()) for name in ID_FIELDS},
                                     **{name: pa.array([], pa.float64()) for name in self.metrics}}), self.path)
            return
        self._writer.close()

    def __enter__(self) -> ParquetPerRequestWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
