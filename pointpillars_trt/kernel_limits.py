"""Launch shapes of the CUDA kernels that bound what a config may ask for: the kernels are compiled with
them and the config validator derives its limits from them, so the CPU path refuses exactly what the
GPU path cannot run. A leaf: plain numbers, importable without CuPy."""

STATIC_SHARED_BYTES = 48 * 1024  # shared memory of one CUDA block without opting in (static, or dynamic by default)
GATHER_WARPS = 8  # pillars per vox_gather block, one warp each (kernels/voxelize.py: -DGATHER_WARPS)
PFN_BLOCK_THREADS = 256  # threads of a pfn_forward block: a pillar's channel groups x pillars (kernels/pfn.py)
SORT_LIMIT = 4096  # keys of one in-block bitonic sort in postprocess.cu (32 KB of shared memory)
