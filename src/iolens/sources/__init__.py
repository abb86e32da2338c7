"""Readers of kernel statistics. Parsers are pure; readers only fetch text.

Every reader takes a root directory (``/proc`` or ``/sys`` by default), so a
container can watch a host's mounted /proc and tests can use fixture trees.
"""
