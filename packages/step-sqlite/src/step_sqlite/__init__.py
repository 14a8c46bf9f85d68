"""step-sqlite: stepcore backend package."""
