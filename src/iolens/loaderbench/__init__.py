"""Measuring a DataLoader's delivery rate, for ``iolens tune`` and ``iolens probe``.

- :mod:`.source`: the dataset (``MODULE:FACTORY`` or a folder of files) and the model step.
- :mod:`.folder`: the built-in Dataset over a class-folder of files, with a decode step.
- :mod:`.measure`: samples per second of a loader after its warm-up; free cores; progress.
- :mod:`.tune`: the search over ``num_workers``, ``prefetch_factor``, ``pin_memory`` and
  ``persistent_workers``.
- :mod:`.probe`: the differential test: compute, preprocessing and storage ceilings.

Everything here imports torch; nothing in ``import iolens`` imports this package.
"""
