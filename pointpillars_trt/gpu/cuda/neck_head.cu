// The RPN neck and heads in one kernel: per branch i a transposed conv with kernel == stride
// (K_i), bias and ReLU, then the 1x1 heads applied to the upsampled maps without ever writing the
// channel concat: heads(concat(u_0, u_1, ...)) = sum_i u_i W_i + b.
//
// A transposed conv with kernel == stride has no overlap: output pixel (y, x) of branch i is
// u_i(y, x) = relu(x_i[y / K_i, x / K_i] . Wd_i[y % K_i, x % K_i] + bd_i), one small matmul per pixel.
// The head map is cut into cells of CELL x CELL pixels (CELL = lcm of the strides); a block takes
// BM cells' pixels at one position (a, b) inside the cell, so every row of its tile uses the same
// weight slice of every branch.
//
// Inputs NHWC: x_i (B, HY / K_i, HX / K_i, B{i}_CIN). Output NHWC float32 (B, HY, HX, NH).
// Weights packed by gpu/neck_head.py (one buffer, offsets as defines). float16: N x K, the mma's
// "col" B operands; float32: K x N, so consecutive threads read consecutive output channels:
//   f16 w[B{i}_W + ((a * K + b) * B{i}_CU + c) * B{i}_KP + k]   deconv slice (a, b): out channel c, in k
//       w[B{i}_HEAD + h * B{i}_CU + c]                          head block W_i^T (NHP x CU_i)
//   f32 w[B{i}_W + ((a * K + b) * B{i}_KP + k) * B{i}_CU + c]
//       w[B{i}_HEAD + c * NHP + h]                              head block W_i (CU_i x NHP)
//   bias[B{i}_BIAS + c], bias[HEAD_BIAS + h]                    float32
// KP (input channels) is padded to 16, CU (upsampled channels) to 32 and NH to NHP (8) with zero
// weights; padded channels come out as relu(0) = 0 and meet zero head weights.
//
// Compile-time configuration (-D options from gpu/neck_head.py): NB (1..3 branches), HY, HX, CELL,
// NH, NHP, HEAD_BIAS and per branch B{i}_CIN, B{i}_KP, B{i}_CU, B{i}_STRIDE, B{i}_W, B{i}_BIAS,
// B{i}_HEAD; CU_MAX (largest B{i}_CU); USE_MMA = 1 for the float16 kernel, 0 for the float32 one.
#include <cuda_fp16.h>

namespace {
constexpr int kCellsY = (HY + CELL - 1) / CELL;
constexpr int kCellsX = (HX + CELL - 1) / CELL;
constexpr int kThreads = 128;

#define BRANCH(i) B##i##_CIN, B##i##_KP, B##i##_CU, B##i##_STRIDE, B##i##_W, B##i##_BIAS, B##i##_HEAD

// Pixel (n, y, x) of row `r` of this block's tile, or n = -1 past the batch or the map edge.
struct Pixel {
    int n, y, x;
};

__device__ __forceinline__ Pixel tile_pixel(int cell, int a, int b, int batch) {
    Pixel p{-1, 0, 0};
    if (cell >= batch * kCellsY * kCellsX) return p;
    const int n = cell / (kCellsY * kCellsX);
    const int rem = cell - n * kCellsY * kCellsX;
    const int y = (rem / kCellsX) * CELL + a;
    const int x = (rem % kCellsX) * CELL + b;
    if (y < HY && x < HX) p = Pixel{n, y, x};
    return p;
}
}  // namespace

#if USE_MMA
// ---------------------------------------------------------------------------------------------
// float16 inputs and weights, tensor cores (mma.sync m16n8k16, float32 accumulation); u_i rounded
// to float16 between the deconv and the heads, as the float16 ONNX graph does.
// Block: 4 warps, BM = 64 rows. Deconv GEMM (64 x CU): warp w owns columns [w CU/4, (w+1) CU/4)
// of all 4 row tiles. Head GEMM (64 x NHP): warp w owns rows [16 w, 16 w + 16), all NHP columns.
// Fragment layouts are the PTX ISA's for m16n8k16 (g = lane / 4, t = lane % 4): A rows g, g + 8 x
// columns 2t, 2t + 1 (+8); B (stored N x K, "col") columns g x k 2t, 2t + 1 (+8); C rows g, g + 8 x
// columns 2t, 2t + 1.
// ---------------------------------------------------------------------------------------------
namespace {
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 64;               // BM
constexpr int kRowTiles = kRows / 16;
constexpr int kChunk = 64;              // input channels gathered per step
constexpr int kAPitch = kChunk + 8;     // halves; +8: the 8 x 4 fragment reads hit 32 banks
constexpr int kUPitch = CU_MAX + 8;
constexpr int kHeadTiles = NHP / 8;
// The B operands are staged in shared memory: a deconv weight chunk (CU x kChunk) during the deconv
// GEMM, then the branch's head block (NHP x CU) in the same bytes. Same +8 padding as the A tiles.
constexpr int kWElems = CU_MAX * kAPitch > NHP * kUPitch ? CU_MAX * kAPitch : NHP * kUPitch;

struct Smem {
    __half a[kRows][kAPitch];
    __half u[kRows][kUPitch];
    __half w[kWElems];
    int n[kRows], y[kRows], x[kRows];
};

// Copy rows x cols halves (cols a multiple of 8) from global (row stride src_pitch) to shared.
__device__ __forceinline__ void stage(__half* dst, int dst_pitch, const __half* __restrict__ src, int src_pitch,
                                      int rows, int cols) {
    const int vecs = cols / 8;
    for (int v = threadIdx.x; v < rows * vecs; v += kThreads) {
        const int r = v / vecs, c = (v % vecs) * 8;
        *reinterpret_cast<uint4*>(dst + r * dst_pitch + c) = __ldg(reinterpret_cast<const uint4*>(src + r * src_pitch + c));
    }
}

__device__ __forceinline__ unsigned ld32(const __half* p) { return *reinterpret_cast<const unsigned*>(p); }

__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A fragment of rows [row0, row0 + 16) x columns [k, k + 16) of a row-major half tile.
__device__ __forceinline__ void load_a(unsigned (&fa)[4], const __half* tile, int pitch, int row0, int k) {
    const int g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
    const __half* p = tile + (row0 + g) * pitch + k + 2 * t;
    fa[0] = ld32(p);
    fa[1] = ld32(p + 8 * pitch);
    fa[2] = ld32(p + 8);
    fa[3] = ld32(p + 8 * pitch + 8);
}

template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ void branch_h(const __half* __restrict__ feat, const __half* __restrict__ w,
                                         const float* __restrict__ bias, Smem& s, int a, int b,
                                         float (&acc_h)[kHeadTiles][4]) {
    constexpr int kH = HY / K, kW = HX / K;
    constexpr int kColTiles = CU / 8 / kWarps;  // per warp
    const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
    const __half* wd = w + WOFF + ((a % K) * K + (b % K)) * CU * KP;  // [co][ci]

    float acc[kRowTiles][kColTiles][4];
#pragma unroll
    for (int i = 0; i < kRowTiles; ++i)
#pragma unroll
        for (int j = 0; j < kColTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    for (int k0 = 0; k0 < KP; k0 += kChunk) {
        const int width = min(kChunk, KP - k0);  // a multiple of 16
        __syncthreads();                          // the previous chunk's (or branch's) readers are done
        for (int v = threadIdx.x; v < kRows * (kChunk / 8); v += kThreads) {
            const int r = v / (kChunk / 8), c = k0 + (v % (kChunk / 8)) * 8;
            uint4 val = make_uint4(0, 0, 0, 0);
            if (s.n[r] >= 0 && c < CIN) {
                const long long pix = (static_cast<long long>(s.n[r]) * kH + s.y[r] / K) * kW + s.x[r] / K;
                val = *reinterpret_cast<const uint4*>(feat + pix * CIN + c);
            }
            *reinterpret_cast<uint4*>(&s.a[r][c - k0]) = val;
        }
        stage(s.w, kAPitch, wd + k0, KP, CU, width);
        __syncthreads();
        for (int kk = 0; kk < width; kk += 16) {
            unsigned fa[kRowTiles][4];
#pragma unroll
            for (int i = 0; i < kRowTiles; ++i) load_a(fa[i], &s.a[0][0], kAPitch, i * 16, kk);
#pragma unroll
            for (int j = 0; j < kColTiles; ++j) {
                const __half* bp = s.w + ((warp * kColTiles + j) * 8 + g) * kAPitch + kk + 2 * t;
                const unsigned b0 = ld32(bp);
                const unsigned b1 = ld32(bp + 8);
#pragma unroll
                for (int i = 0; i < kRowTiles; ++i) mma16816(acc[i][j], fa[i], b0, b1);
            }
        }
    }
    __syncthreads();  // every warp is done with s.w's deconv chunk
    stage(s.w, kUPitch, w + HOFF, CU, NHP, CU);
    // Epilogue: + bias, ReLU, round to half into s.u (the heads' A operand).
#pragma unroll
    for (int j = 0; j < kColTiles; ++j) {
        const int col = (warp * kColTiles + j) * 8 + 2 * t;
        const float b0 = bias[BOFF + col], b1 = bias[BOFF + col + 1];
#pragma unroll
        for (int i = 0; i < kRowTiles; ++i) {
            const int row = i * 16 + g;
            *reinterpret_cast<__half2*>(&s.u[row][col]) =
                __floats2half2_rn(fmaxf(acc[i][j][0] + b0, 0.0f), fmaxf(acc[i][j][1] + b1, 0.0f));
            *reinterpret_cast<__half2*>(&s.u[row + 8][col]) =
                __floats2half2_rn(fmaxf(acc[i][j][2] + b0, 0.0f), fmaxf(acc[i][j][3] + b1, 0.0f));
        }
    }
    __syncthreads();
    // Heads: acc_h (this warp's 16 rows) += u (16 x CU) . W_i, W_i stored [h][c].
    for (int kk = 0; kk < CU; kk += 16) {
        unsigned fa[4];
        load_a(fa, &s.u[0][0], kUPitch, warp * 16, kk);
#pragma unroll
        for (int h = 0; h < kHeadTiles; ++h) {
            const __half* bp = s.w + (h * 8 + g) * kUPitch + kk + 2 * t;
            mma16816(acc_h[h], fa, ld32(bp), ld32(bp + 8));
        }
    }
}
}  // namespace

// grid (ceil(B * cells / 64), CELL * CELL), block 128.
extern "C" __global__ void __launch_bounds__(kThreads) neck_head_f16(
        const __half* __restrict__ x0, const __half* __restrict__ x1, const __half* __restrict__ x2,
        const __half* __restrict__ w, const float* __restrict__ bias, float* __restrict__ out, int batch) {
    __shared__ __align__(16) Smem s;
    const int a = blockIdx.y / CELL, b = blockIdx.y % CELL;
    const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
    for (int r = threadIdx.x; r < kRows; r += kThreads) {
        const Pixel p = tile_pixel(blockIdx.x * kRows + r, a, b, batch);
        s.n[r] = p.n;
        s.y[r] = p.y;
        s.x[r] = p.x;
    }
    float acc_h[kHeadTiles][4];
#pragma unroll
    for (int h = 0; h < kHeadTiles; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_h[h][e] = 0.0f;

    branch_h<BRANCH(0)>(x0, w, bias, s, a, b, acc_h);
#if NB > 1
    branch_h<BRANCH(1)>(x1, w, bias, s, a, b, acc_h);
#endif
#if NB > 2
    branch_h<BRANCH(2)>(x2, w, bias, s, a, b, acc_h);
#endif

#pragma unroll
    for (int half_row = 0; half_row < 2; ++half_row) {
        const int r = warp * 16 + g + 8 * half_row;
        if (s.n[r] < 0) continue;
        float* o = out + ((static_cast<long long>(s.n[r]) * HY + s.y[r]) * HX + s.x[r]) * NH;
#pragma unroll
        for (int h = 0; h < kHeadTiles; ++h) {
            const int ch = h * 8 + 2 * t;
            if (ch < NH) o[ch] = acc_h[h][2 * half_row] + bias[HEAD_BIAS + ch];
            if (ch + 1 < NH) o[ch + 1] = acc_h[h][2 * half_row + 1] + bias[HEAD_BIAS + ch + 1];
        }
    }
}

#else
// ---------------------------------------------------------------------------------------------
// float32 inputs and weights, plain FMA in float32 (the tf32 and IEEE fp32 precisions).
// Block: 128 threads, 32 rows; deconv outputs and head sums live in shared memory.
// ---------------------------------------------------------------------------------------------
namespace {
constexpr int kRows = 32;
constexpr int kChunk = 32;

struct Smem {
    float a[kRows][kChunk];
    float u[kRows][CU_MAX];
    float head[kRows][NHP];
    int n[kRows], y[kRows], x[kRows];
};

template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ void branch_f(const float* __restrict__ feat, const float* __restrict__ w,
                                         const float* __restrict__ bias, Smem& s, int a, int b) {
    constexpr int kH = HY / K, kW = HX / K;
    const float* wd = w + WOFF + ((a % K) * K + (b % K)) * KP * CU;  // [ci][co]
    for (int c0 = 0; c0 < CU; c0 += kThreads) {  // every thread runs every pass: the syncs below need them all
        const int c = c0 + threadIdx.x;
        float acc[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
        for (int k0 = 0; k0 < CIN; k0 += kChunk) {
            __syncthreads();
            for (int v = threadIdx.x; v < kRows * kChunk; v += kThreads) {
                const int r = v / kChunk, k = k0 + v % kChunk;
                float val = 0.0f;
                if (s.n[r] >= 0 && k < CIN) {
                    const long long pix = (static_cast<long long>(s.n[r]) * kH + s.y[r] / K) * kW + s.x[r] / K;
                    val = feat[pix * CIN + k];
                }
                s.a[r][v % kChunk] = val;
            }
            __syncthreads();
            if (c < CU) {
                const int width = min(kChunk, CIN - k0);
                for (int k = 0; k < width; ++k) {
                    const float wv = wd[(k0 + k) * CU + c];
#pragma unroll
                    for (int r = 0; r < kRows; ++r) acc[r] = fmaf(s.a[r][k], wv, acc[r]);
                }
            }
        }
        if (c < CU) {
#pragma unroll
            for (int r = 0; r < kRows; ++r) s.u[r][c] = fmaxf(acc[r] + bias[BOFF + c], 0.0f);
        }
    }
    __syncthreads();
    for (int o = threadIdx.x; o < kRows * NH; o += kThreads) {
        const int r = o / NH, h = o % NH;
        float acc = s.head[r][h];
        for (int c = 0; c < CU; ++c) acc = fmaf(s.u[r][c], w[HOFF + c * NHP + h], acc);
        s.head[r][h] = acc;
    }
}
}  // namespace

// grid (ceil(B * cells / 32), CELL * CELL), block 128.
extern "C" __global__ void __launch_bounds__(kThreads) neck_head_f32(
        const float* __restrict__ x0, const float* __restrict__ x1, const float* __restrict__ x2,
        const float* __restrict__ w, const float* __restrict__ bias, float* __restrict__ out, int batch) {
    __shared__ Smem s;
    const int a = blockIdx.y / CELL, b = blockIdx.y % CELL;
    for (int r = threadIdx.x; r < kRows; r += kThreads) {
        const Pixel p = tile_pixel(blockIdx.x * kRows + r, a, b, batch);
        s.n[r] = p.n;
        s.y[r] = p.y;
        s.x[r] = p.x;
    }
    for (int o = threadIdx.x; o < kRows * NHP; o += kThreads) (&s.head[0][0])[o] = 0.0f;
    __syncthreads();
    branch_f<BRANCH(0)>(x0, w, bias, s, a, b);
#if NB > 1
    branch_f<BRANCH(1)>(x1, w, bias, s, a, b);
#endif
#if NB > 2
    branch_f<BRANCH(2)>(x2, w, bias, s, a, b);
#endif
    __syncthreads();
    for (int o = threadIdx.x; o < kRows * NH; o += kThreads) {
        const int r = o / NH, h = o % NH;
        if (s.n[r] < 0) continue;
        const long long pix = (static_cast<long long>(s.n[r]) * HY + s.y[r]) * HX + s.x[r];
        out[pix * NH + h] = s.head[r][h] + bias[HEAD_BIAS + h];
    }
}
#endif
