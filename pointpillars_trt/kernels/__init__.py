"""The CUDA stages of the pipeline (voxelize, PFN, scatter, neck-head, post-process), compiled once
through CuPy. They sit below the engines: nothing here imports runtime/ or the pipeline."""
