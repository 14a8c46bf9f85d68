"""Capability-level conformance: real pydantic-ai Agent runs driven through a backend's store."""


class CapabilityConformance:
    """Tests that run a real ``Agent`` with ``StepPersistence`` against the subclass's ``store`` fixture.

    Placeholder until the capability section lands; ``StepStoreConformance`` inherits it.
    """
