"""The version of the interval records' schema (see :mod:`iolens.rundir`)."""

SCHEMA_VERSION = 3
