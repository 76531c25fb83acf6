// Block-level building blocks shared by the stage kernels.
//
// _launch.py pastes this header into each .cu before compiling it, so CuPy's kernel cache sees the
// whole source; nvcc finds it through the ordinary #include when the files are compiled directly.
#ifndef PP_COMMON_CUH
#define PP_COMMON_CUH

#define PP_FULL_MASK 0xffffffffu

// A batch's frames run in one launch, frame blockIdx.z: each per-frame buffer of a stage holds the
// batch's frames back to back, and this is the calling block's frame's part of one.
template <typename T>
__device__ __forceinline__ T* frame_part(T* base, long long per_frame) {
    return base + static_cast<long long>(blockIdx.z) * per_frame;
}

// Inclusive prefix sum across the 32 lanes of a warp.
__device__ __forceinline__ int pp_warp_inclusive_scan(int v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int u = __shfl_up_sync(PP_FULL_MASK, v, d);
        if (lane >= d) v += u;
    }
    return v;
}

// Exclusive prefix sum over the block in thread order; *total receives the block's sum.
// Every thread of the block must call it (blockDim.x a multiple of 32); it ends with a barrier, so
// it can be called again right away.
__device__ __forceinline__ int pp_block_exclusive_scan(int v, int* total) {
    __shared__ int warp_prefix[33];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int num_warps = blockDim.x >> 5;
    const int inclusive = pp_warp_inclusive_scan(v);
    if (lane == 31) warp_prefix[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
        const int w = lane < num_warps ? warp_prefix[lane] : 0;
        const int w_inclusive = pp_warp_inclusive_scan(w);
        if (lane < num_warps) warp_prefix[lane] = w_inclusive - w;
        if (lane == 31) warp_prefix[32] = w_inclusive;
    }
    __syncthreads();
    const int out = warp_prefix[warp] + inclusive - v;
    *total = warp_prefix[32];
    __syncthreads();
    return out;
}

__device__ __forceinline__ int pp_block_sum(int v) {
    int total;
    pp_block_exclusive_scan(v, &total);
    return total;
}

// Turns per-block counts (row b of a (num_blocks, stride) table, column 0) into exclusive offsets in
// place, for a compaction whose second pass adds a block-local scan. Run by one whole block; returns
// the grand total to every thread. The remaining columns of each row are summed into totals[1..].
template <int STRIDE>
__device__ __forceinline__ int pp_scan_block_counts(int* counts, int num_blocks, int* totals) {
    int carry = 0;
    int extra[STRIDE];
#pragma unroll
    for (int c = 1; c < STRIDE; ++c) extra[c] = 0;
    for (int base = 0; base < num_blocks; base += blockDim.x) {
        const int b = base + threadIdx.x;
        const int v = b < num_blocks ? counts[b * STRIDE] : 0;
#pragma unroll
        for (int c = 1; c < STRIDE; ++c) extra[c] += b < num_blocks ? counts[b * STRIDE + c] : 0;
        int chunk;
        const int excl = pp_block_exclusive_scan(v, &chunk);
        if (b < num_blocks) counts[b * STRIDE] = carry + excl;
        carry += chunk;
    }
#pragma unroll
    for (int c = 1; c < STRIDE; ++c) {
        const int s = pp_block_sum(extra[c]);
        if (threadIdx.x == 0) totals[c] = s;
    }
    if (threadIdx.x == 0) totals[0] = carry;
    return carry;
}

// Bitonic sort of n (a power of two) 64-bit keys in shared memory, descending; whole block calls it.
__device__ __forceinline__ void pp_bitonic_sort_desc(unsigned long long* keys, int n) {
    for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int t = threadIdx.x; t < (n >> 1); t += blockDim.x) {
                const int lo = 2 * t - (t & (stride - 1));
                const int hi = lo + stride;
                const bool descending = (lo & size) == 0;
                const unsigned long long a = keys[lo];
                const unsigned long long b = keys[hi];
                if ((a < b) == descending) {
                    keys[lo] = b;
                    keys[hi] = a;
                }
            }
        }
    }
    __syncthreads();
}

#endif  // PP_COMMON_CUH
