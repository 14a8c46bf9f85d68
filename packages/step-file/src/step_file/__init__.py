"""step-file: stepcore backend package."""
