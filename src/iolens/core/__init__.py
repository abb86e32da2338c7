"""Pure functions over kernel counters: snapshots in, rates out."""
