"""The release of this stepcore package."""

VERSION = '0.1.0'
