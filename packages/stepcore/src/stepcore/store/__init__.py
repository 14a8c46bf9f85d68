"""The store contract: records, the `StepStore` protocol and base class, and the rules every store shares."""
