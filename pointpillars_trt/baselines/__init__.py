"""Peer implementations the benchmark times our pipeline against; each imports its own framework."""
