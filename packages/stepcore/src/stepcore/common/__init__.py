"""What every layer shares: feature names, the damaged-record error, encryption keys."""
