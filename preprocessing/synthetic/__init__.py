"""Generated datasets (skewed tabular, tokens) for the demo, tests and benchmarks."""
