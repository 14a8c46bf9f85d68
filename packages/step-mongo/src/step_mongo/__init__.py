"""step-mongo: stepcore backend package."""
