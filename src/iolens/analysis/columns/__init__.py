"""A run's interval figures as typed columns, read once (NOTE [columns]).

:class:`StageColumns` holds, one entry per interval record, the loop's batches, steps and
waits, the epochs' starts and the pauses, the processes' CPU and bytes, the machine's CPU,
the workers' stage timing and what helpers read for the job; :class:`DeviceColumns`,
:class:`RoleColumns`, :class:`StoreColumns`, :class:`RankColumns` and
:class:`GpuColumns` each device's, each role's, each storage entry's, each rank's and each
GPU's figures, and :class:`CpuColumns` the machine's CPU, with the indices of the
intervals that have them (in ``named``); :class:`RunView` a run as the verdict takes
it, and :class:`RunColumns` and :class:`Span` what the verdict reads (in ``run``);
:class:`SeriesColumns` the figures the report's charts draw (in ``series``).
Built once from a run's records (or from the model's resampling blocks), any span or pick
of intervals is then summed from them without reading a record again: the model
(:func:`iolens.analysis.model.figures`), the pipeline
(:func:`iolens.analysis.pipeline.pipeline_over`), the verdict (:class:`RunColumns`, and
its windows as :class:`Span`) and the report's tables.
"""

from __future__ import annotations

from iolens.analysis.columns.named import (
    CpuColumns,
    DeviceColumns,
    DeviceLoad,
    GpuColumns,
    RankColumns,
    RoleColumns,
    StoreColumns,
)
from iolens.analysis.columns.run import RunColumns, RunView, Span
from iolens.analysis.columns.series import Figure, SeriesColumns
from iolens.analysis.columns.stage import StageColumns, added, amount, network_bytes

"""NOTE [columns]: records travel as dicts from the run directory, and each part of the
analysis used to read the figures it needs out of every record again, through its own
helpers. The model read them 201 times a report (the run once, then each of its 200
resamples of up to 40 blocks), and was built twice (before and after the storage's
ceiling was known): in a week's report, 1.5 s of 5.3 under a profiler. The columns are
read from the records once; a figure over a span is a sum over entries, added in the
records' order (the figures are the same to the last bit as those read from the records
one by one: the recorded runs' reports are byte for byte those of the code that read the
records). The verdict's windows are interval indices into the columns, not lists of
records; the model's resampling blocks are folded from the columns (NOTE [blocks from
the columns] in stage.py). An autotuned run's verdict takes the view of its intervals
since the last change of settings (picked by their clock, ``t``) from the whole run's.
The report's HTML charts read :class:`SeriesColumns`, the figures as recorded (a chart
leaves a missing figure out where a sum takes it as 0). What still reads records: the long
run's fold (a Bucket folds records). `iolens compare` reads each run's columns (its
interval samples, its per-interval distributions, the pipeline of its proof) and hands
each run's view to its verdict."""

__all__ = [
    "CpuColumns",
    "DeviceColumns",
    "DeviceLoad",
    "Figure",
    "GpuColumns",
    "RankColumns",
    "RoleColumns",
    "RunColumns",
    "RunView",
    "SeriesColumns",
    "Span",
    "StageColumns",
    "StoreColumns",
    "added",
    "amount",
    "network_bytes",
]
