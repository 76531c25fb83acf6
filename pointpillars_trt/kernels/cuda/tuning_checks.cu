// What the cuDNN engine's tuning checks a candidate plan with (kernels/tuning_checks.py): random
// inputs in the engine's precision, and a batch's outputs against batch 1's, frame by frame. Written
// here so that a machine's first start compiles one module for them rather than a CuPy module per
// elementwise operation. CHECK_HALF: 1 for float16 activations, 0 for float32.
#include <cuda_fp16.h>

#if CHECK_HALF
typedef __half value_t;
typedef unsigned short bits_t;
__device__ __forceinline__ float to_float(value_t v) { return __half2float(v); }
__device__ __forceinline__ value_t from_float(float f) { return __float2half_rn(f); }
#else
typedef float value_t;
typedef unsigned int bits_t;
__device__ __forceinline__ float to_float(value_t v) { return v; }
__device__ __forceinline__ value_t from_float(float f) { return f; }
#endif

// splitmix64's finaliser: 24 well-mixed bits of (seed, index)
__device__ __forceinline__ unsigned int mixed_bits(unsigned long long seed, long long index) {
    unsigned long long x = (unsigned long long)index + seed * 0xD1B54A32D192ED03ull + 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return (unsigned int)((x ^ (x >> 31)) >> 40);
}

// out[i] = a uniform value in [0, 1) (24 bits, then rounded to the precision), a function of (seed, i)
extern "C" __global__ void check_fill_uniform(value_t* out, long long n, unsigned long long seed) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = from_float((float)mixed_bits(seed, i) * 0x1p-24f);
    }
}

// For frame blockIdx.y of `got` and `want` (per_frame values each): how many values differ in their
// bits, the largest |got - want| and the largest |want| (a NaN counts as infinity), accumulated with
// atomics into unequal[frame], worst_bits[frame] and scale_bits[frame] (non-negative floats' bits
// order as the floats do). The outputs start at zero.
extern "C" __global__ void check_compare_frames(const value_t* got, const value_t* want, long long per_frame,
                                                unsigned int* unequal, unsigned int* worst_bits,
                                                unsigned int* scale_bits) {
    const long long offset = (long long)blockIdx.y * per_frame;
    const bits_t* got_bits = reinterpret_cast<const bits_t*>(got) + offset;
    const bits_t* want_bits = reinterpret_cast<const bits_t*>(want) + offset;
    unsigned int differ = 0;
    float worst = 0.0f, scale = 0.0f;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < per_frame; i += stride) {
        const float g = to_float(got[offset + i]), w = to_float(want[offset + i]);
        differ += got_bits[i] != want_bits[i];
        float d = fabsf(g - w), m = fabsf(w);
        d = d == d ? d : __int_as_float(0x7f800000);  // infinity
        m = m == m ? m : __int_as_float(0x7f800000);
        worst = fmaxf(worst, d);
        scale = fmaxf(scale, m);
    }
    for (int lane = 16; lane > 0; lane >>= 1) {
        differ += __shfl_xor_sync(0xffffffffu, differ, lane);
        worst = fmaxf(worst, __shfl_xor_sync(0xffffffffu, worst, lane));
        scale = fmaxf(scale, __shfl_xor_sync(0xffffffffu, scale, lane));
    }
    if ((threadIdx.x & 31) == 0) {
        if (differ) atomicAdd(&unequal[blockIdx.y], differ);
        atomicMax(&worst_bits[blockIdx.y], __float_as_uint(worst));
        atomicMax(&scale_bits[blockIdx.y], __float_as_uint(scale));
    }
}
