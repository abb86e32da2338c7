"""Running a job under the recorder: ``iolens run`` (:mod:`iolens.job.run`) and the sidecar
of ``iolens.monitor()`` (:mod:`iolens.job.sidecar`).

The top of the house below the CLI: it starts the job, the recorder, the live view and
the sinks, and writes the verdict at the end, so it may import all of them; nothing
below imports it.
"""
