"""media-disk: stepcore backend package."""
