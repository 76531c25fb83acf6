// Scores and sort keys shared by the post-process kernels: the sigmoid and threshold test the
// references use, and 64-bit keys (score bits high, inverted tie index low) whose descending order
// is (score desc, index asc). Needs SCORE_INCLUSIVE defined.
#ifndef PP_SCORE_KEYS_CUH
#define PP_SCORE_KEYS_CUH

namespace {

constexpr unsigned kIndexMask = 0xffffffffu;

__device__ __forceinline__ float sigmoid(float x) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
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

}  // namespace

#endif  // PP_SCORE_KEYS_CUH
