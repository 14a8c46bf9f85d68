"""The conformance suite for stepcore backends."""
