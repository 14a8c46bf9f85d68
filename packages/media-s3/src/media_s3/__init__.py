"""media-s3: stepcore backend package."""
