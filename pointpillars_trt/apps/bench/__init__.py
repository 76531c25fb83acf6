"""``pointpillars-trt bench``: latency, throughput, copies and memory, against two baselines."""
