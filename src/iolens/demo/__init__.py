"""A small real PyTorch training on generated small files: ``python -m iolens.demo``."""
