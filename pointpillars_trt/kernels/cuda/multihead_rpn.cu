// The parts of a multi-head RPN (OpenPCDet's AnchorHeadMulti) that are not plain 3x3 convs, which
// the cuDNN engine runs: the neck branches and the heads' output convs. NHWC throughout; inputs
// and weights are float16 (IO_HALF) or float32 values, sums in float32, outputs rounded to the
// input type as the ONNX graph's convs round them (the head map is float32 holding those values).
//
//   neck_branch  a conv whose kernel equals its stride, no overlap: DOWN (a strided conv, the 0.5
//                upsample) sums a k x k patch of the input; UP (a transposed conv) maps each input
//                pixel through the weight slice of one place (tap) of its k x k output cell.
//                + bias + ReLU, written into a channel slice of the neck's concat buffer.
//                Weights (k * k * cin, cout) float32: row (tap * cin + ci), tap = ky * k + kx.
//   head_conv    every head's output convs at once: branch g (a class conv or one box-code part of
//                one head) is a 3x3 conv (padding 1) of channels [g * MID, (g + 1) * MID) of the
//                middle buffer to its `n` channels of the merged head map, + bias, no ReLU.
//                Weights (branches, MAX_OUT, 9, MID) float32, zero past a branch's `n`.
//
// Compile-time configuration (-D options from multihead_rpn.py): IO_HALF, PIXELS (pixels per
// neck_branch block), NECK_MAX_K (largest reduction of a branch: k * k * cin down, cin up), MID,
// MAX_OUT, TILE_X (head_conv: tile width; TILE_X^2 threads), CI_CHUNK (middle channels staged at a
// time; divides MID), BRANCH_INTS and BRANCH_* (columns of the head_conv branch table).
#include <cuda_fp16.h>

namespace {

#if IO_HALF
using io_t = __half;
__device__ __forceinline__ float load(const io_t* p) { return __half2float(*p); }
__device__ __forceinline__ io_t store_value(float v) { return __float2half_rn(v); }
__device__ __forceinline__ float rounded(float v) { return __half2float(__float2half_rn(v)); }
#else
using io_t = float;
__device__ __forceinline__ float load(const io_t* p) { return *p; }
__device__ __forceinline__ io_t store_value(float v) { return v; }
__device__ __forceinline__ float rounded(float v) { return v; }
#endif

}  // namespace

// Block: PIXELS consecutive pixels of one tap, every output channel (threads stride over them), so
// each weight read serves PIXELS sums. DOWN: PIXELS output pixels, each summing its k x k patch;
// UP: PIXELS input pixels, each giving output pixel (iy * k + ky, ix * k + kx) of tap blockIdx.y.
// Grid: (ceil(pixels / PIXELS), UP ? k * k : 1), pixels = batch * (DOWN ? out : in) height * width.
extern "C" __global__ void neck_branch(const io_t* __restrict__ in, const float* __restrict__ weight,
                                       const float* __restrict__ bias, io_t* __restrict__ out, int batch, int in_h,
                                       int in_w, int cin, int out_h, int out_w, int cout, int k, int down,
                                       int out_stride, int out_offset) {
    __shared__ float values[PIXELS][NECK_MAX_K];
    __shared__ long long target[PIXELS];  // output pixel of each of the block's pixels, -1 past the end
    const int reduce = down ? k * k * cin : cin;
    const int tap = blockIdx.y, ky = tap / k, kx = tap % k;
    const int grid_h = down ? out_h : in_h, grid_w = down ? out_w : in_w;
    const long long total = static_cast<long long>(batch) * grid_h * grid_w;
    const long long first = static_cast<long long>(blockIdx.x) * PIXELS;
    for (int p = threadIdx.x; p < PIXELS; p += blockDim.x) {
        const long long pixel = first + p;
        long long at = -1;
        if (pixel < total) {
            const int n = static_cast<int>(pixel / (grid_h * grid_w));
            const int rem = static_cast<int>(pixel - static_cast<long long>(n) * grid_h * grid_w);
            const int y = rem / grid_w, x = rem - (rem / grid_w) * grid_w;
            at = down ? pixel : (static_cast<long long>(n) * out_h + y * k + ky) * out_w + x * k + kx;
        }
        target[p] = at;
    }
    for (int i = threadIdx.x; i < PIXELS * reduce; i += blockDim.x) {
        const int p = i / reduce, r = i - p * reduce;
        const long long pixel = first + p;
        float v = 0.0f;
        if (pixel < total) {
            const int n = static_cast<int>(pixel / (grid_h * grid_w));
            const int rem = static_cast<int>(pixel - static_cast<long long>(n) * grid_h * grid_w);
            const int y = rem / grid_w, x = rem - (rem / grid_w) * grid_w;
            int iy = y, ix = x, ci = r;
            if (down) {
                const int patch = r / cin;
                ci = r - patch * cin;
                iy = y * k + patch / k;
                ix = x * k + patch % k;
            }
            v = load(in + ((static_cast<long long>(n) * in_h + iy) * in_w + ix) * cin + ci);
        }
        values[p][r] = v;
    }
    __syncthreads();
    const float* rows = weight + (down ? 0 : static_cast<long long>(tap) * cin * cout);
    for (int c = threadIdx.x; c < cout; c += blockDim.x) {
        float acc[PIXELS];
#pragma unroll
        for (int p = 0; p < PIXELS; ++p) acc[p] = 0.0f;
        for (int r = 0; r < reduce; ++r) {
            const float w = rows[static_cast<long long>(r) * cout + c];
#pragma unroll
            for (int p = 0; p < PIXELS; ++p) acc[p] = fmaf(values[p][r], w, acc[p]);
        }
        const float b = bias[c];
#pragma unroll
        for (int p = 0; p < PIXELS; ++p)
            if (target[p] >= 0) out[target[p] * out_stride + out_offset + c] = store_value(fmaxf(acc[p] + b, 0.0f));
    }
}

namespace {

constexpr int kHeadRows = 4 * TILE_X + 2, kHeadCols = TILE_X + 2;

// The body of head_conv for a branch of at most N outputs (N <= MAX_OUT): only N outputs a pixel are
// summed, so a branch of 2 or 4 channels does not pay for the widest branch's MAX_OUT.
template <int N>
__device__ __forceinline__ void head_conv_branch(const io_t* __restrict__ mid, const float* __restrict__ w,
                                                 const float* __restrict__ bias, float* __restrict__ out,
                                                 float (*tile)[kHeadRows][kHeadCols], float (*w_chunk)[9][CI_CHUNK],
                                                 int n, int g, int count, int out_at, int mid_channels, int height,
                                                 int width, int out_channels) {
    constexpr int kThreads = TILE_X * TILE_X;
    const int y0 = blockIdx.y * 4 * TILE_X, x0 = blockIdx.x * TILE_X;
    const int ty = threadIdx.x / TILE_X, tx = threadIdx.x % TILE_X;
    float acc[4][N];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int o = 0; o < N; ++o) acc[i][o] = 0.0f;
    for (int c0 = 0; c0 < MID; c0 += CI_CHUNK) {
        __syncthreads();  // the previous chunk is no longer read
        for (int i = threadIdx.x; i < kHeadRows * kHeadCols * CI_CHUNK; i += kThreads) {
            const int ci = i % CI_CHUNK, cell = i / CI_CHUNK;
            const int r = cell / kHeadCols, c = cell % kHeadCols;
            const int y = y0 + r - 1, x = x0 + c - 1;
            float v = 0.0f;
            if (y >= 0 && y < height && x >= 0 && x < width)
                v = load(mid + ((static_cast<long long>(n) * height + y) * width + x) * mid_channels + g * MID + c0 + ci);
            tile[ci][r][c] = v;
        }
        for (int i = threadIdx.x; i < N * 9 * CI_CHUNK; i += kThreads) {
            const int ci = i % CI_CHUNK, rest = i / CI_CHUNK;
            w_chunk[rest / 9][rest % 9][ci] = w[static_cast<long long>(rest) * MID + c0 + ci];
        }
        __syncthreads();
        for (int tap = 0; tap < 9; ++tap) {
            const int dy = tap / 3, dx = tap % 3;
#pragma unroll 4
            for (int ci = 0; ci < CI_CHUNK; ++ci) {
                float v[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) v[i] = tile[ci][4 * ty + i + dy][tx + dx];
#pragma unroll
                for (int o = 0; o < N; ++o) {
                    const float wo = w_chunk[o][tap][ci];
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[i][o] = fmaf(v[i], wo, acc[i][o]);
                }
            }
        }
    }
    const int x = x0 + tx;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int y = y0 + 4 * ty + i;
        if (y >= height || x >= width) continue;
        float* dst = out + ((static_cast<long long>(n) * height + y) * width + x) * out_channels + out_at;
#pragma unroll
        for (int o = 0; o < N; ++o)
            if (o < count) dst[o] = rounded(acc[i][o] + bias[g * MAX_OUT + o]);
    }
}

constexpr int kAtMost4 = MAX_OUT < 4 ? MAX_OUT : 4;
constexpr int kAtMost8 = MAX_OUT < 8 ? MAX_OUT : 8;

}  // namespace

// Block: a (4 TILE_X) x TILE_X tile of one frame's head map, one branch, TILE_X * TILE_X threads;
// thread (ty, tx) takes pixels (4 ty + i, tx), i < 4, and the branch's outputs (4, 8 or MAX_OUT of
// them summed, whichever first holds its count). The middle channels come in chunks of CI_CHUNK,
// tile and weights staged in shared memory, so each weight read serves four pixels and each value
// read every output. Grid: (tiles x, tiles y, batch * branches). branches: (out_at, count) per branch.
extern "C" __global__ void __launch_bounds__(TILE_X * TILE_X)
head_conv(const io_t* __restrict__ mid, const float* __restrict__ weight, const float* __restrict__ bias,
          const int* __restrict__ branches, float* __restrict__ out, int num_branches, int height, int width,
          int out_channels) {
    __shared__ float tile[CI_CHUNK][kHeadRows][kHeadCols];
    __shared__ float w_chunk[MAX_OUT][9][CI_CHUNK];
    const int g = blockIdx.z % num_branches, n = blockIdx.z / num_branches;
    const int out_at = branches[g * BRANCH_INTS + BRANCH_OUT_AT], count = branches[g * BRANCH_INTS + BRANCH_COUNT];
    const float* w = weight + static_cast<long long>(g) * MAX_OUT * 9 * MID;
    const int mid_channels = num_branches * MID;
    if (count <= kAtMost4)  // uniform over the block: one branch
        head_conv_branch<kAtMost4>(mid, w, bias, out, tile, w_chunk, n, g, count, out_at, mid_channels, height, width,
                                   out_channels);
    else if (count <= kAtMost8)
        head_conv_branch<kAtMost8>(mid, w, bias, out, tile, w_chunk, n, g, count, out_at, mid_channels, height, width,
                                   out_channels);
    else
        head_conv_branch<MAX_OUT>(mid, w, bias, out, tile, w_chunk, n, g, count, out_at, mid_channels, height, width,
                                  out_channels);
}
