"""The recorder: samples the machine and the job each interval into interval records.

Below it: the sources (kernel counters) and the run directory's format
(:mod:`iolens.rundir`). The job's orchestration (starting it, the live view, the
sinks, the verdict at the end) is :mod:`iolens.job`, above it.
"""
