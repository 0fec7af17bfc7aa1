"""The Ray Tune sweep: driver, trial, storage, and the sweep folder's layout."""
