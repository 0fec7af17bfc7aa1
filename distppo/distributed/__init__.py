"""The Ray shells of a single run: actors around core's plain objects, and RayRuntime."""
