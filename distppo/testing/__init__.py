"""Test support that lives in the package: what runs inside Ray workers (faults.py) and what
tests/ and launch/ share (ports.py)."""
