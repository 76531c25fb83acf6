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
//   head_conv_mma  the same convs on tensor cores, float32 sums: float16 on mma.sync m16n8k16, or float32
//                as TF32 on m16n8k8 (the tf32 precision; never for IEEE fp32). Weights (branches, 9, HEAD_N,
//                MID) in the input type (TF32 values for float32), HEAD_N = MAX_OUT rounded up to 8.
//   neck_branch_mma  neck_branch on tensor cores, as head_conv_mma (cin whole stages): a GEMM of
//                gathered rows. Weights (taps, cout, reduce): DOWN one tap of reduce = k * k * cin
//                (tap * cin + ci), UP k * k taps of reduce = cin.
//
// Compile-time configuration (-D options from multihead_rpn.py): IO_HALF, PIXELS (pixels per
// neck_branch block), NECK_MAX_K (largest reduction of a branch: k * k * cin down, cin up), MID,
// MAX_OUT, TILE_X (head_conv: tile width; TILE_X^2 threads), CI_CHUNK (middle channels staged at a
// time; divides MID), BRANCH_INTS and BRANCH_* (columns of the head_conv branch table), and for
// head_conv_mma HEAD_N, HEAD_CHUNK (middle channels staged at a time; divides MID), MMA_TILE_H and
// MMA_TILE_W (its tile of pixels: a warp takes two rows of 16), and for neck_branch_mma NECK_COLS (output
// channels a block) and NECK_STAGE_BYTES (bytes of a row's reduce staged at a time). HEAD_MMA and NECK_MMA
// compile the tensor-core kernels: only where they are launched, as a shape too large for their shared
// memory would fail the whole module.
#include <cuda_fp16.h>

#include "mma_sync.cuh"

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

#if HEAD_MMA || NECK_MMA
namespace {

// The tensor-core kernels' operands: float16 on mma.sync m16n8k16 (below), or float32 as TF32 on m16n8k8
// (the tf32 precision: mma_sync.cuh's a_fragment and mma_step; IEEE fp32 runs the FMA kernels above). Either
// way a lane holds A's and B's values at k (2t, 2t + 1) of a step's first 8.
#if IO_HALF
constexpr int kMmaK = 16;  // k of one mma

__device__ __forceinline__ unsigned half_pair(const __half* p) { return *reinterpret_cast<const unsigned*>(p); }

// An A fragment from shared memory: rows g and g + 8 (`p0` points at row g's values 2t, 2t + 1 of the k
// step; rows lie `pitch` values apart), columns 2t (+ 1) and 2t + 8 (+ 1).
__device__ __forceinline__ void a_fragment(unsigned (&a)[4], const __half* p0, int pitch) {
    const __half* p1 = p0 + 8 * pitch;
    a[0] = half_pair(p0);
    a[1] = half_pair(p1);
    a[2] = half_pair(p0 + 8);
    a[3] = half_pair(p1 + 8);
}

// d += A times B's column at `q` (its values 2t, 2t + 1 of the k step; 2t + 8, 2t + 9 follow 8 on).
__device__ __forceinline__ void mma_step(float (&d)[4], const unsigned (&a)[4], const __half* q) {
    mma16816(d, a, half_pair(q), half_pair(q + 8));
}

__device__ __forceinline__ void store_pair(__half* dst, float lo, float hi) {
    *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(lo, hi);
}
#else
constexpr int kMmaK = 8;

__device__ __forceinline__ void store_pair(float* dst, float lo, float hi) {
    *reinterpret_cast<float2*>(dst) = make_float2(lo, hi);
}
#endif

constexpr int kPiece = 16 / static_cast<int>(sizeof(io_t));  // values in the 16 bytes of one cp.async

}  // namespace
#endif

#if HEAD_MMA
namespace {

constexpr int kMmaWarps = MMA_TILE_H / 2;           // a warp: two rows of the tile, 16 pixels each
constexpr int kMmaRows = MMA_TILE_H + 2, kMmaCols = MMA_TILE_W + 2;  // the tile with its 3x3 halo
constexpr int kMmaPitch = HEAD_CHUNK + 8;            // values a pixel (a weight row): the +8 puts the fragments'
                                                     // loads of a warp (or half-warp) in distinct banks
constexpr int kMmaPieces = HEAD_CHUNK / kPiece;      // 16-byte pieces of a pixel's staged channels
static_assert(MMA_TILE_W == 16 && MMA_TILE_H % 2 == 0 && MID % HEAD_CHUNK == 0 && HEAD_CHUNK % kMmaK == 0 &&
                  HEAD_CHUNK % kPiece == 0 && HEAD_N % 8 == 0,
              "head_conv_mma's shape");

}  // namespace

// Block: an MMA_TILE_H x 16 tile of one frame's head map, one branch, kMmaWarps warps. The conv is an
// implicit GEMM, pixels x outputs over 9 taps x MID channels, HEAD_CHUNK channels at a time: the chunk's
// channels of the tile and its halo, and its weights, are staged in shared memory (cp.async); warp w
// multiplies rows 2w and 2w + 1 (an m16 tile each) by the branch's outputs in n8 tiles, as many as its
// count needs. Grid: (tiles x, tiles y, batch * branches). branches: (out_at, count) per branch.
extern "C" __global__ void __launch_bounds__(32 * kMmaWarps)
head_conv_mma(const io_t* __restrict__ mid, const io_t* __restrict__ weight, const float* __restrict__ bias,
              const int* __restrict__ branches, float* __restrict__ out, int num_branches, int height, int width,
              int out_channels) {
    __shared__ __align__(16) io_t tile[kMmaRows * kMmaCols][kMmaPitch];
    __shared__ __align__(16) io_t w_tile[9 * HEAD_N][kMmaPitch];
    const int branch = blockIdx.z % num_branches, n = blockIdx.z / num_branches;
    const int out_at = branches[branch * BRANCH_INTS + BRANCH_OUT_AT];
    const int count = branches[branch * BRANCH_INTS + BRANCH_COUNT];
    const int y0 = blockIdx.y * MMA_TILE_H, x0 = blockIdx.x * MMA_TILE_W;
    const int mid_channels = num_branches * MID;
    const io_t* w = weight + static_cast<long long>(branch) * 9 * HEAD_N * MID;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int n_tiles = (count + 7) / 8;  // uniform over the block: one branch
    float acc[2][HEAD_N / 8][4] = {};
#pragma unroll 1
    for (int c0 = 0; c0 < MID; c0 += HEAD_CHUNK) {
        if (c0) __syncthreads();  // the chunk before is no longer read
        for (int i = threadIdx.x; i < kMmaRows * kMmaCols * kMmaPieces; i += blockDim.x) {
            const int pixel = i / kMmaPieces, piece = i - pixel * kMmaPieces;
            const int y = y0 + pixel / kMmaCols - 1, x = x0 + pixel % kMmaCols - 1;
            const bool inside = y >= 0 && y < height && x >= 0 && x < width;
            const io_t* src = inside ? mid + ((static_cast<long long>(n) * height + y) * width + x) * mid_channels +
                                           branch * MID + c0 + piece * kPiece
                                     : mid;  // not read: zeros are written
            cp_async16(&tile[pixel][piece * kPiece], src, inside ? 16 : 0);
        }
        for (int i = threadIdx.x; i < 9 * HEAD_N * kMmaPieces; i += blockDim.x) {
            const int row = i / kMmaPieces, piece = i - row * kMmaPieces;
            cp_async16(&w_tile[row][piece * kPiece], w + static_cast<long long>(row) * MID + c0 + piece * kPiece, 16);
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
#pragma unroll 1
        for (int tap = 0; tap < 9; ++tap) {
            const int dy = tap / 3, dx = tap % 3;
#pragma unroll
            for (int k0 = 0; k0 < HEAD_CHUNK; k0 += kMmaK) {
                unsigned a[2][4];
#pragma unroll
                for (int m = 0; m < 2; ++m)  // A: pixels (g, g + 8) of tile row 2 warp + m, channels k0 + 2t ...
                    a_fragment(a[m], tile[(2 * warp + m + dy) * kMmaCols + g + dx] + k0 + 2 * t, kMmaPitch);
#pragma unroll
                for (int j = 0; j < HEAD_N / 8; ++j) {
                    if (j >= n_tiles) break;
                    const io_t* q = w_tile[tap * HEAD_N + 8 * j + g] + k0 + 2 * t;  // B: output 8 j + g
                    mma_step(acc[0][j], a[0], q);
                    mma_step(acc[1][j], a[1], q);
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < 2; ++m) {
        const int y = y0 + 2 * warp + m;
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // C: pixel g (+ 8), outputs 8 j + 2t (+ 1)
            const int x = x0 + g + 8 * h;
            if (y >= height || x >= width) continue;
            float* dst = out + ((static_cast<long long>(n) * height + y) * width + x) * out_channels + out_at;
#pragma unroll
            for (int j = 0; j < HEAD_N / 8; ++j) {
#pragma unroll
                for (int v = 0; v < 2; ++v) {
                    const int o = 8 * j + 2 * t + v;
                    if (o < count) dst[o] = rounded(acc[m][j][2 * h + v] + bias[branch * MAX_OUT + o]);
                }
            }
        }
    }
}
#endif

#if NECK_MMA
namespace {

constexpr int kNeckRows = 64, kNeckCols = NECK_COLS;  // a block's GEMM tile
constexpr int kWarpCols = kNeckCols / 2;                 // a warp's output channels (4 warps: 2 x 2)
constexpr int kNeckPieces = NECK_STAGE_BYTES / 16;       // 16-byte pieces of a row a stage
constexpr int kNeckChunk = kNeckPieces * kPiece;         // reduce values a stage
constexpr int kNeckPitch = kNeckChunk + 8;  // values a staged row: a warp's (a half-warp's, 64-bit) fragment
                                            // loads in distinct banks
static_assert(kWarpCols % 8 == 0 && kNeckChunk % kMmaK == 0, "neck_branch_mma's shape");

// The input row GEMM row `row` of the block reads (its pixel's values [r0, r0 + kNeckChunk) of the reduce), or null
// past the frame's pixels; and, with `target`, the output pixel it gives.
__device__ __forceinline__ const io_t* neck_source(const io_t* in, long long pixel, long long total, int r0,
                                                     int in_h, int in_w, int cin, int grid_h, int grid_w, int k,
                                                     int down) {
    if (pixel >= total) return nullptr;
    const int n = static_cast<int>(pixel / (grid_h * grid_w));
    const int rem = static_cast<int>(pixel - static_cast<long long>(n) * grid_h * grid_w);
    int y = rem / grid_w, x = rem - (rem / grid_w) * grid_w, ci = r0;
    if (down) {
        const int patch = r0 / cin;
        ci = r0 - patch * cin;
        y = y * k + patch / k;
        x = x * k + patch % k;
    }
    return in + ((static_cast<long long>(n) * in_h + y) * in_w + x) * cin + ci;
}

}  // namespace

// Block: 64 GEMM rows (DOWN: output pixels; UP: input pixels of tap blockIdx.y) x NECK_COLS output channels
// (blockIdx.z), 4 warps of 32 rows x NECK_COLS / 2 channels. The reduce goes through shared memory kNeckChunk values
// at a time (cin a multiple), two stages of cp.async, the next stage loading while the warps multiply the last.
// Grid: (ceil(pixels / 64), UP ? k * k : 1, ceil(cout / NECK_COLS)), pixels as neck_branch's.
extern "C" __global__ void __launch_bounds__(128)
neck_branch_mma(const io_t* __restrict__ in, const io_t* __restrict__ weight, const float* __restrict__ bias,
                io_t* __restrict__ out, int batch, int in_h, int in_w, int cin, int out_h, int out_w, int cout,
                int k, int down, int out_stride, int out_offset) {
    __shared__ __align__(16) io_t a_s[2][kNeckRows][kNeckPitch];
    __shared__ __align__(16) io_t b_s[2][kNeckCols][kNeckPitch];
    const int reduce = down ? k * k * cin : cin;
    const int tap = blockIdx.y, ky = tap / k, kx = tap % k;
    const int grid_h = down ? out_h : in_h, grid_w = down ? out_w : in_w;
    const long long total = static_cast<long long>(batch) * grid_h * grid_w;
    const long long first = static_cast<long long>(blockIdx.x) * kNeckRows;
    const int c_first = blockIdx.z * kNeckCols;
    const io_t* w = weight + static_cast<long long>(tap) * cout * reduce;

    auto stage = [&](int buffer, int r0) {
        for (int i = threadIdx.x; i < kNeckRows * kNeckPieces; i += blockDim.x) {
            const int row = i / kNeckPieces, piece = i % kNeckPieces;
            const io_t* src = neck_source(in, first + row, total, r0, in_h, in_w, cin, grid_h, grid_w, k, down);
            cp_async16(&a_s[buffer][row][piece * kPiece], src ? src + piece * kPiece : in, src ? 16 : 0);
        }
        for (int i = threadIdx.x; i < kNeckCols * kNeckPieces; i += blockDim.x) {
            const int row = i / kNeckPieces, piece = i % kNeckPieces, c = c_first + row;
            const bool live = c < cout;
            cp_async16(&b_s[buffer][row][piece * kPiece],
                       live ? w + static_cast<long long>(c) * reduce + r0 + piece * kPiece : w, live ? 16 : 0);
        }
        cp_async_commit();
    };

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int wm = warp / 2, wn = warp % 2;  // the warp's 32 rows and kWarpCols channels
    float acc[2][kWarpCols / 8][4] = {};
    const int chunks = reduce / kNeckChunk;
    stage(0, 0);
    for (int chunk = 0; chunk < chunks; ++chunk) {
        const int buffer = chunk & 1;
        if (chunk + 1 < chunks) {
            stage(buffer ^ 1, (chunk + 1) * kNeckChunk);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int k0 = 0; k0 < kNeckChunk; k0 += kMmaK) {
            unsigned a[2][4];
#pragma unroll
            for (int m = 0; m < 2; ++m) a_fragment(a[m], &a_s[buffer][wm * 32 + m * 16 + g][k0 + 2 * t], kNeckPitch);
#pragma unroll
            for (int j = 0; j < kWarpCols / 8; ++j) {
                const io_t* q = &b_s[buffer][wn * kWarpCols + j * 8 + g][k0 + 2 * t];
                mma_step(acc[0][j], a[0], q);
                mma_step(acc[1][j], a[1], q);
            }
        }
        __syncthreads();  // the buffer is read no more: the stage after next may load into it
    }
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // C: rows g (+ 8) of the m16 tile, channels 8 j + 2t (+ 1)
            const long long pixel = first + wm * 32 + m * 16 + g + 8 * h;
            if (pixel >= total) continue;
            long long at = pixel;
            if (!down) {
                const int n = static_cast<int>(pixel / (grid_h * grid_w));
                const int rem = static_cast<int>(pixel - static_cast<long long>(n) * grid_h * grid_w);
                const int y = rem / grid_w, x = rem - (rem / grid_w) * grid_w;
                at = (static_cast<long long>(n) * out_h + y * k + ky) * out_w + x * k + kx;
            }
            io_t* dst = out + at * out_stride + out_offset;
#pragma unroll
            for (int j = 0; j < kWarpCols / 8; ++j) {
                const int c = c_first + wn * kWarpCols + j * 8 + 2 * t;
                if (c < cout)  // cout is even: the pair is whole
                    store_pair(dst + c, fmaxf(acc[m][j][2 * h] + bias[c], 0.0f), fmaxf(acc[m][j][2 * h + 1] + bias[c + 1], 0.0f));
            }
        }
    }
}
#endif
