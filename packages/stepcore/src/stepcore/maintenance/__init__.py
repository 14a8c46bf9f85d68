"""Whole-store maintenance: media garbage collection."""
