"""What a run records: the metrics schema, Parquet and TensorBoard sinks, timers, run info."""
