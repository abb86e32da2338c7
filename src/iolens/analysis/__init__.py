"""Analysis: pure functions over recorded runs (the verdict, summaries, comparisons)."""
