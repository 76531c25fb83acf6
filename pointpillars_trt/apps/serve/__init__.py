"""Serving the detector at scale: a Triton model repository and server launcher, its client, and the
``serve`` / ``infer --server`` / ``infer --ray`` CLI glue. tritonclient and Ray are imported lazily."""
