"""What the benchmark scripts share: the process harness, generated data, the report and targets."""
