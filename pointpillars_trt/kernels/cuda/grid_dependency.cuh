// Programmatic dependent launch (compute capability 9.0+): _launch.py may start a kernel while the one
// before it on the stream is finishing, so that its launch overlaps that kernel's tail. Every kernel
// therefore calls pp_wait_for_prior_grids() first: it returns once the grids it depends on have
// completed and their writes are visible, before this kernel reads or writes anything they touch.
// Elsewhere (older GPUs, ordinary launches) it compiles to nothing and stream order alone holds.
#ifndef PP_GRID_DEPENDENCY_CUH
#define PP_GRID_DEPENDENCY_CUH

__device__ __forceinline__ void pp_wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

#endif  // PP_GRID_DEPENDENCY_CUH
