"""Helpers the test suite (and users' own tests) use: multi-process runs, fault injection."""
