"""Counts in words that agree with them (pure)."""

from __future__ import annotations


def plural(n: int | float, noun: str, many: str | None = None) -> str:
    """``n`` and ``noun``, in the plural unless ``n`` is 1: ``1 epoch``, ``2 epochs``,
    ``1 DataLoader worker``. ``many`` is the plural where adding "s" is wrong."""
    count = int(n) if float(n).is_integer() else n
    word = noun if count == 1 else (many or noun + "s")
    return f"{count} {word}"
