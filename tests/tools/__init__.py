"""Test helpers: a throw-away tiny-profile copy of the repository, and the two-run determinism check."""
