"""Benchmarks (not tests) behind ``python -m sat_core.bench``: training throughput, decoding speed, bf16 against
fp32, compiled and graphed decode steps."""
