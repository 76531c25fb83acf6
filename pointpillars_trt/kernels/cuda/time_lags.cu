// A multi-sweep frame's time lags (the 5th value of each row) summarised where they lie, for the input
// check of a frame given on the GPU (kernels/time_lags.py): each block writes the minimum and maximum of
// its share of the lags that are no NaN and its count of NaN, and the blocks together write the sample of
// every `step`-th lag. The host reduces the blocks' partials after one small read.
extern "C" __global__ void lag_partials(const float* points, long long row_stride, long long column_stride,
                                        long long rows, long long step, int sample_size, float* partials,
                                        float* sample) {
    float lo = __int_as_float(0x7f800000), hi = __int_as_float(0xff800000), nans = 0.0f;  // inf, -inf
    const long long lag = 4 * column_stride;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < rows;
         i += (long long)gridDim.x * blockDim.x) {
        const float v = points[i * row_stride + lag];
        if (v != v) {  // NaN
            nans += 1.0f;
        } else {
            lo = fminf(lo, v);
            hi = fmaxf(hi, v);
        }
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        lo = fminf(lo, __shfl_down_sync(0xffffffffu, lo, offset));
        hi = fmaxf(hi, __shfl_down_sync(0xffffffffu, hi, offset));
        nans += __shfl_down_sync(0xffffffffu, nans, offset);
    }
    __shared__ float warp_lo[32], warp_hi[32], warp_nans[32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    if (lane == 0) {
        warp_lo[warp] = lo;
        warp_hi[warp] = hi;
        warp_nans[warp] = nans;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < warps; ++w) {
            lo = fminf(lo, warp_lo[w]);
            hi = fmaxf(hi, warp_hi[w]);
            nans += warp_nans[w];
        }
        partials[3 * blockIdx.x] = lo;
        partials[3 * blockIdx.x + 1] = hi;
        partials[3 * blockIdx.x + 2] = nans;  // exact: a block's count stays far below 2^24
    }
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < sample_size; k += gridDim.x * blockDim.x) {
        const long long i = k * step;
        sample[k] = i < rows ? points[i * row_stride + lag] : __int_as_float(0x7fc00000);  // NaN past the end
    }
}
