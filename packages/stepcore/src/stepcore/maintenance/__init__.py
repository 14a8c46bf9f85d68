"""Whole-store maintenance: checking every record, and media garbage collection."""
