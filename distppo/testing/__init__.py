"""Test support that must live in the package because it runs inside Ray workers."""
