"""Plugins: the registry of backends found through entry points, their hooks, options and URLs."""
