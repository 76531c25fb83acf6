"""Applications built on the detector: CLI, demo, benchmark, evaluation, serving."""
