"""The binary timing records the training process hands to the sidecar.

Each record is three signed 64-bit integers ``(kind, a, b)`` in native byte
order, appended to ``<run>/timing/<pid>.bin``. Times are CLOCK_MONOTONIC
nanoseconds (``time.monotonic_ns``), the sidecar's clock too. The low byte
of ``kind`` is the record type; the bits above it hold the loader's tag.
"""

from __future__ import annotations

BATCH = 1
"""a = when ``next()`` was called, b = when it returned the batch."""
EPOCH = 2
"""a = when iteration over the loader began (``iter(loader)``), b = num_workers."""
STEP = 3
"""a = the moment ``iolens.step()`` was called, b = 0."""
WORKER = 4
"""a = a DataLoader worker's pid, b = its worker id."""
RANK = 5
"""a = the process's rank (torchrun's RANK), b = the world size; written once, first."""

RECORD_BYTES = 24
TAG_SHIFT = 8
TYPE_MASK = 0xFF
