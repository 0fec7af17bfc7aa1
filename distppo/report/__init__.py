"""`distppo report`: a sweep's Parquet files -> tables, aggregates and plots. Ray-free."""
