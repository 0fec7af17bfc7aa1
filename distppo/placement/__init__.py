"""Placement: a run's execution settings as numbers (resolve.py) and the sizing rules behind
them (sizing.py). Pure: no Ray, no torch."""
