// Scores and sort keys shared by the post-process kernels: the sigmoid and threshold test the
// references use, the overflow test of a logit and its warp count, 64-bit keys (score bits high,
// inverted tie index low) whose descending order is (score desc, index asc), and the block-wide
// top-k selection. Needs SCORE_INCLUSIVE and OVERFLOWED_LOGIT defined and common.cuh included
// before it.
#ifndef PP_SCORE_KEYS_CUH
#define PP_SCORE_KEYS_CUH

namespace {

constexpr unsigned kIndexMask = 0xffffffffu;

__device__ __forceinline__ float sigmoid(float x) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
}

// Whether a class logit is NaN, infinite or beyond OVERFLOWED_LOGIT: the network overflowed there.
__device__ __forceinline__ int overflowed(float logit) {
    return !(fabsf(logit) <= OVERFLOWED_LOGIT);
}

// Adds the warp's count `n` to *counter: one atomic a warp that has any, none otherwise (an overflowed
// logit is that rare). Every lane of the warp calls it.
__device__ __forceinline__ void add_warp_count(int* counter, int n) {
    if (!__any_sync(PP_FULL_MASK, n)) return;
    for (int d = 16; d > 0; d >>= 1) n += __shfl_down_sync(PP_FULL_MASK, n, d);
    if ((threadIdx.x & 31) == 0) atomicAdd(counter, n);
}

__device__ __forceinline__ bool passes(float score, float threshold) {
#if SCORE_INCLUSIVE
    return score >= threshold;
#else
    return score > threshold;
#endif
}

__device__ __forceinline__ unsigned long long score_key(float score, unsigned tie) {
    // Non-negative floats order like their bit patterns; a lower tie index ranks first.
    return (static_cast<unsigned long long>(__float_as_uint(score)) << 32) | (kIndexMask - tie);
}

__device__ __forceinline__ unsigned key_index(unsigned long long key) {
    return kIndexMask - static_cast<unsigned>(key & kIndexMask);
}

__device__ __forceinline__ float key_score(unsigned long long key) {
    return __uint_as_float(static_cast<unsigned>(key >> 32));
}

__device__ __forceinline__ int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}

// The k largest of n 32-bit values (k < n; larger values rank higher, equal ones by lower index) into
// keys[0..k), as make_key(index, value), in no set order: an 8-bit-digit radix select finds the k-th
// value, then the values above it and the first of those equal to it are taken in index order.
// Every thread of the block calls it; it returns after a barrier.
template <typename MakeKey>
__device__ void select_top_keys(const unsigned* __restrict__ values, int n, int k, unsigned long long* keys,
                                MakeKey make_key) {
    __shared__ int hist[256];
    __shared__ int found_digit, found_remaining;
    unsigned prefix = 0, mask = 0;
    int remaining = k;  // how many of the values matching `prefix` are still to take
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += blockDim.x) hist[d] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const unsigned u = values[i];
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1);
        }
        __syncthreads();
        // Digits from the top: thread t holds digit 255 - t.
        const int count = threadIdx.x < 256 ? hist[255 - threadIdx.x] : 0;
        int unused;
        const int above = pp_block_exclusive_scan(count, &unused);
        if (threadIdx.x < 256 && above < remaining && remaining <= above + count) {
            found_digit = 255 - threadIdx.x;
            found_remaining = remaining - above;
        }
        __syncthreads();
        prefix |= static_cast<unsigned>(found_digit) << shift;
        mask |= 255u << shift;
        remaining = found_remaining;
        __syncthreads();
    }
    int taken = 0, ties = 0;
    for (int base = 0; base < n && taken < k; base += blockDim.x) {
        const int i = base + threadIdx.x;
        const unsigned u = i < n ? values[i] : 0u;
        const bool tie = i < n && u == prefix;
        int tie_count, take_count;
        const int tie_rank = ties + pp_block_exclusive_scan(tie, &tie_count);
        const bool take = i < n && (u > prefix || (tie && tie_rank < remaining));
        const int pos = taken + pp_block_exclusive_scan(take, &take_count);
        if (take) keys[pos] = make_key(i, u);
        ties += tie_count;
        taken += take_count;
    }
}

}  // namespace

#endif  // PP_SCORE_KEYS_CUH
