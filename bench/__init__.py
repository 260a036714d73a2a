"""Benchmarks behind ``make bench`` (throughput and idle memory of real worker processes)."""
