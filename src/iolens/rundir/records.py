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

# -- the input pipeline's stages (NOTE [stage timing] in iolens/training/_hooks.py) ----------
# A DataLoader worker (or the training process itself, with num_workers=0) writes
# these four, in this order, for every batch it fetches.
FETCH = 6
"""a = wall ns from the batch's indices in hand to its collate starting (``dataset[i]``,
``__getitems__`` or the iterable's ``next``), b = the part of it on the thread's CPU clock."""
STAGE = 7
"""a = wall ns of the collate, b = ns the worker waited for these indices (idle: the
loader is ahead) since it handed its previous batch over."""
COUNT = 8
"""a = samples in the batch, b = files opened while fetching and collating it."""
READY = 9
"""a = the batch's index in its epoch, b = when the worker handed it over (monotonic ns)."""
HANDOVER = 10
"""Written by the training process right after a worker batch's BATCH record:
a = the batch's index in its epoch, b = when ``next()`` was called for it."""
ITERABLE = 11
"""Written with an epoch's EPOCH record by ``iolens.instrument()`` around a loader that is
not a torch DataLoader (a generator, any iterable): a = 1, b = 0. It has no workers to
add: the verdict's advice for it differs."""
