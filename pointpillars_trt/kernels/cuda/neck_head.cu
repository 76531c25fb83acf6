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
// Inputs NHWC: x_i (B, HY / K_i, HX / K_i, B{i}_CIN), or for the float32 kernel with NH_IN_NCHW
// (B, B{i}_CIN, HY / K_i, HX / K_i). Output NHWC float32 (B, HY, HX, NH).
// Weights packed by gpu/neck_head.py (one buffer, offsets as defines). float16 and TF32: N x K, the
// mma's "col" B operands; float32: K x N, so consecutive threads read consecutive output channels:
//   f16, tf32 w[B{i}_W + ((a * K + b) * B{i}_CU + c) * B{i}_KP + k]   deconv slice (a, b): out channel c, in k
//             w[B{i}_HEAD + h * B{i}_CU + c]                          head block W_i^T (NHP x CU_i)
//   f32 w[B{i}_W + ((a * K + b) * B{i}_KP + k) * B{i}_CU + c]
//       w[B{i}_HEAD + c * NHP + h]                              head block W_i (CU_i x NHP)
//   bias[B{i}_BIAS + c], bias[HEAD_BIAS + h]                    float32
// KP (input channels) is padded to 16, CU (upsampled channels) to 32 and NH to NHP (8) with zero
// weights; padded channels come out as relu(0) = 0 and meet zero head weights.
//
// Compile-time configuration (-D options from gpu/neck_head.py): NB (1..3 branches), HY, HX, CELL,
// NH, NHP, HEAD_BIAS and per branch B{i}_CIN, B{i}_KP, B{i}_CU, B{i}_STRIDE, B{i}_W, B{i}_BIAS,
// B{i}_HEAD; CU_MAX (largest B{i}_CU); USE_MMA = 1 for the float16 kernel, USE_TF32 = 1 for the TF32
// one (CU_MAX <= NH_TF32_MAX_UP), both 0 for the float32 one; NH_IN_NCHW (float32 only): channel-major
// inputs; NH_BLOCK_THREADS and NH_BLOCK_ROWS, the launch shape the host computes (checked here).
#include <cuda_fp16.h>

static_assert(!(NH_IN_NCHW && (USE_MMA || USE_TF32)), "channel-major features are read by the float32 kernel only");

#include "mma_sync.cuh"
#include "neck_head_common.cuh"

#if USE_MMA
// ---------------------------------------------------------------------------------------------
// float16 inputs and weights, tensor cores (mma.sync m16n8k16, float32 accumulation); u_i rounded
// to float16 between the deconv and the heads, as the float16 ONNX graph does.
// Block: NH_WARPS warps, BM = 16 NH_WARPS rows (cells at one position (a, b)). Warp w owns rows
// [16 w, 16 w + 16) through the whole kernel: its deconv accumulators (16 x CU, all columns) become,
// after bias + ReLU + rounding, the A fragments of its head GEMM in registers (the C layout of two
// m16n8 tiles is the A layout of one m16k16 step), so u never touches shared memory.
// The block walks a fixed sequence of steps: per branch, its input channels in chunks of kChunk
// (A: BM x kChunk gathered input rows, W: CU x kChunk deconv weight slice), then one head step (W: the
// branch's NHP x CU head block). Each step's operands are cp.async'ed NH_STAGES - 1 steps ahead into
// a ring of NH_STAGES shared-memory stages (dynamic shared memory, NH_SMEM bytes, then the rows' input
// pixel indices); fragments come from ldmatrix. Fragment layouts are the PTX ISA's for m16n8k16 (g = lane / 4, t = lane % 4).
// ---------------------------------------------------------------------------------------------
namespace {
constexpr int kWarps = NH_WARPS;
constexpr int kThreadsH = kWarps * 32;
constexpr int kRows = 16 * kWarps;      // BM
static_assert(kThreadsH == NH_BLOCK_THREADS && kRows == NH_BLOCK_ROWS, "the launch shape of gpu/neck_head.py");
constexpr int kStages = NH_STAGES;
constexpr int kAPitch = kChunk + 8;     // halves; +16 bytes: ldmatrix's 8 row reads hit distinct banks
constexpr int kHPitch = CU_MAX + 8;
constexpr int kHeadTiles = NHP / 8;
constexpr int kAElems = kRows * kAPitch;
constexpr int kWElems = CU_MAX * kAPitch > NHP * kHPitch ? CU_MAX * kAPitch : NHP * kHPitch;
constexpr int kStageElems = kAElems + kWElems;
constexpr int kRowsPerThread = kRows * (kChunk / 8) / kThreadsH;  // gathered rows per thread (4)
static_assert(kStageElems * 2 * kStages + 3 * kRows * 4 == NH_SMEM, "NH_SMEM must match gpu/neck_head.py");
static_assert(kStages >= 2 && kRowsPerThread * kThreadsH == kRows * (kChunk / 8), "pipeline shape");
constexpr int kSteps0 = kChunks0 + 1;  // a branch's steps: its chunks, then its head step
constexpr int kSteps1 = kChunks1 + (NB > 1);
constexpr int kSteps2 = kChunks2 + (NB > 2);
constexpr int kSteps = kSteps0 + kSteps1 + kSteps2;

// A branch's head step on mma.sync: u as A fragments straight from the deconv's accumulators
// (u_fragment), times the branch's head block W_i^T (NHP x CU, rows of CU_MAX + 8 halves at `sh`,
// shared memory).
template <int CU, int BOFF>
__device__ __forceinline__ void head_step(const float* acc, const float* __restrict__ bias, const unsigned short* sh,
                                          float (&acc_h)[NHP / 8][4]) {
    constexpr int kPitch = CU_MAX + 8;  // ldmatrix's 8 row reads in distinct banks
    constexpr int kTiles = NHP / 8;
    const int lane = threadIdx.x % 32, t = lane % 4, lr = lane % 8, lm = lane / 8;
#pragma unroll
    for (int j = 0; j < CU / 16; ++j) {
        unsigned fa[4];
        u_fragment<BOFF>(acc, bias, j, t, fa);
        const unsigned short* pb = sh + ((lm >> 1) * 8 + lr) * kPitch + j * 16 + (lm & 1) * 8;
#pragma unroll
        for (int h = 0; h + 1 < kTiles; h += 2) {
            unsigned fb[4];
            ldsm_x4(fb, pb + h * 8 * kPitch);
            mma16816(acc_h[h], fa, fb[0], fb[1]);
            mma16816(acc_h[h + 1], fa, fb[2], fb[3]);
        }
        if (kTiles % 2) {
            unsigned fb[2];
            ldsm_x2(fb, sh + ((kTiles - 1) * 8 + lr) * kPitch + j * 16 + (lm & 1) * 8);
            mma16816(acc_h[kTiles - 1], fa, fb[0], fb[1]);
        }
    }
}


template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ void load_chunk(int chunk, const __half* __restrict__ feat, const __half* __restrict__ w,
                                           const int* pix, int a, int b, __half* st) {
    const int k0 = chunk * kChunk;
    const int width = KP % kChunk == 0 ? kChunk : min(kChunk, KP - k0);  // a multiple of 16
    const int vec = threadIdx.x % 8;
    if (vec * 8 < width) {
        const int c = k0 + vec * 8;
#pragma unroll
        for (int j = 0; j < kRowsPerThread; ++j) {
            const int r = threadIdx.x / 8 + j * (kThreadsH / 8);
            const int px = pix[r];
            const bool ok = px >= 0 && c < CIN;
            const __half* src = ok ? feat + static_cast<long long>(px) * CIN + c : feat;
            cp_async16(st + r * kAPitch + vec * 8, src, ok ? 16 : 0);
        }
    }
    const __half* wd = w + WOFF + ((a % K) * K + (b % K)) * CU * KP + k0;  // [co][ci]
    __half* sw = st + kAElems;
#pragma unroll
    for (int v = threadIdx.x; v < CU * (kChunk / 8); v += kThreadsH) {
        const int co = v / (kChunk / 8), kv = (v % (kChunk / 8)) * 8;
        if (kv < width) cp_async16(sw + co * kAPitch + kv, wd + co * KP + kv, 16);
    }
}

template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ void load_head(const __half* __restrict__ w, __half* st) {
    __half* sw = st + kAElems;
    constexpr int kVecs = CU / 8;
    for (int v = threadIdx.x; v < NHP * kVecs; v += kThreadsH) {
        const int h = v / kVecs, c = (v % kVecs) * 8;
        cp_async16(sw + h * kHPitch + c, w + HOFF + h * CU + c, 16);
    }
}

template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ void load_step(int step, const __half* __restrict__ feat, const __half* __restrict__ w,
                                          const int* pix, int a, int b, __half* st) {
    if (step < chunks_of(KP)) {
        load_chunk<CIN, KP, CU, K, WOFF, BOFF, HOFF>(step, feat, w, pix, a, b, st);
    } else {
        load_head<CIN, KP, CU, K, WOFF, BOFF, HOFF>(w, st);
    }
}

// Issue the loads of global step `step` (if any) into its stage, then commit a group (possibly empty:
// the wait counts in the main loop assume one group per step).
__device__ __forceinline__ void issue(int step, const __half* __restrict__ x0, const __half* __restrict__ x1,
                                      const __half* __restrict__ x2, const __half* __restrict__ w,
                                      const RowPixels<kRows>& gat,
                                      int a, int b, __half* smem) {
    __half* st = smem + (step % kStages) * kStageElems;
    if (step < kSteps0) {
        load_step<BRANCH(0)>(step, x0, w, gat.pix[0], a, b, st);
    }
#if NB > 1
    else if (step < kSteps0 + kSteps1) {
        load_step<BRANCH(1)>(step - kSteps0, x1, w, gat.pix[1], a, b, st);
    }
#endif
#if NB > 2
    else if (step < kSteps) {
        load_step<BRANCH(2)>(step - kSteps0 - kSteps1, x2, w, gat.pix[2], a, b, st);
    }
#endif
    cp_async_commit();
}

struct Ctx {
    const __half* x0;
    const __half* x1;
    const __half* x2;
    const __half* w;
    const float* bias;
    __half* smem;
    int a, b;
};

// Wait for step `step`'s stage, then put step + kStages - 1 in flight; returns the stage to read.
__device__ __forceinline__ const __half* advance(int step, const Ctx& cx, const RowPixels<kRows>& gat) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // the stage is complete for every thread, and the one refilled below is read by none
    issue(step + kStages - 1, cx.x0, cx.x1, cx.x2, cx.w, gat, cx.a, cx.b, cx.smem);
    return cx.smem + (step % kStages) * kStageElems;
}

template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ void branch_h(int& step, const Ctx& cx, const RowPixels<kRows>& gat,
                                         float (&acc)[CU_MAX / 8][4],
                                         float (&acc_h)[kHeadTiles][4]) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int lr = lane % 8, lm = lane / 8;
#pragma unroll
    for (int j = 0; j < CU / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

    for (int chunk = 0; chunk < chunks_of(KP); ++chunk, ++step) {
        const __half* st = advance(step, cx, gat);
        const int width = KP % kChunk == 0 ? kChunk : min(kChunk, KP - chunk * kChunk);
        // A: matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15); B: (n 0-7 | 8-15) x (k 0-7 | 8-15).
        const __half* pa = st + (warp * 16 + (lm & 1) * 8 + lr) * kAPitch + (lm >> 1) * 8;
        const __half* pb = st + kAElems + ((lm >> 1) * 8 + lr) * kAPitch + (lm & 1) * 8;
#pragma unroll 2
        for (int kk = 0; kk < width; kk += 16) {
            unsigned fa[4];
            ldsm_x4(fa, pa + kk);
#pragma unroll
            for (int j = 0; j < CU / 16; ++j) {
                unsigned fb[4];
                ldsm_x4(fb, pb + j * 16 * kAPitch + kk);
                mma16816(acc[2 * j], fa, fb[0], fb[1]);
                mma16816(acc[2 * j + 1], fa, fb[2], fb[3]);
            }
        }
    }
    // Head step: u = half(relu(acc + bias)) as A fragments, times the head block W_i^T (NHP x CU).
    const __half* st = advance(step, cx, gat);
    ++step;
    head_step<CU, BOFF>(&acc[0][0], cx.bias, reinterpret_cast<const unsigned short*>(st + kAElems), acc_h);
}
}  // namespace

// grid (ceil(B * cells / BM), CELL * CELL), block 32 NH_WARPS, NH_SMEM bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(kThreadsH, NH_MIN_BLOCKS) neck_head_f16(
        const __half* __restrict__ x0, const __half* __restrict__ x1, const __half* __restrict__ x2,
        const __half* __restrict__ w, const float* __restrict__ bias, float* __restrict__ out, int batch) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int a = blockIdx.y / CELL, b = blockIdx.y % CELL;
    const int warp = threadIdx.x / 32;
    const Ctx cx{x0, x1, x2, w, bias, reinterpret_cast<__half*>(smem_raw), a, b};

    RowPixels<kRows>& gat = *reinterpret_cast<RowPixels<kRows>*>(smem_raw + kStages * kStageElems * 2);
    gather_rows(gat.pix, blockIdx.x * kRows, a, b, batch);
    __syncthreads();
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s, x0, x1, x2, w, gat, a, b, cx.smem);

    float acc[CU_MAX / 8][4];
    float acc_h[kHeadTiles][4];
    zero(acc_h);

    int step = 0;
    branch_h<BRANCH(0)>(step, cx, gat, acc, acc_h);
#if NB > 1
    branch_h<BRANCH(1)>(step, cx, gat, acc, acc_h);
#endif
#if NB > 2
    branch_h<BRANCH(2)>(step, cx, gat, acc, acc_h);
#endif
    cp_async_wait<0>();  // only empty groups remain; leave none in flight at exit
    store_heads(acc_h, blockIdx.x * kRows + warp * 16, a, b, batch, bias, out);
}

#elif USE_TF32
// ---------------------------------------------------------------------------------------------
// float32 inputs and weights on tensor cores as TF32 (mma.sync m16n8k8, float32 accumulation): the
// tf32 precision's arithmetic, as cuDNN's TF32 convolutions before it. Inputs are rounded to TF32
// (cvt.rna) as they are read, the weights were rounded once when packed, u is rounded between the
// deconv and the heads. The float16 kernel's scheme without its cp.async ring: 4 warps, 64 rows
// (cells at one position (a, b)); warp w owns rows [16 w, 16 w + 16) through the whole kernel and
// its deconv accumulators (16 x CU) become the A fragments of its head GEMM in registers. A step
// stages a 64 x 32 chunk of gathered input rows and the CU x 32 deconv weight slice in shared
// memory. Within a k-step of 8 a thread holds the channel pair (2t, 2t + 1) where the PTX ISA's
// m16n8k8 layout names (t, t + 4): a sum over k does not depend on its order, so A and B agree, a
// pair is one 64-bit load, and the deconv's C fragments (columns 2t, 2t + 1) are the head GEMM's A
// fragments as they are.
// ---------------------------------------------------------------------------------------------
namespace {
constexpr int kWarpsT = 4;
constexpr int kThreadsT = 32 * kWarpsT;
constexpr int kRowsT = 16 * kWarpsT;
constexpr int kChunkT = 32;           // input channels a step
constexpr int kPitchT = kChunkT + 8;  // floats: the 16 threads of a 64-bit load (4 rows x 4 pairs) hit 32 banks
constexpr int kHeadTilesT = NHP / 8;
static_assert(kThreadsT == NH_BLOCK_THREADS && kRowsT == NH_BLOCK_ROWS, "the launch shape of gpu/neck_head.py");
static_assert(CU_MAX <= NH_TF32_MAX_UP, "the weight slice and the accumulators are sized for NH_TF32_MAX_UP channels");

struct SmemT {
    float a[kRowsT][kPitchT];
    float w[CU_MAX][kPitchT];
    int pix[3][kRowsT];
};

template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ void branch_t(const float* __restrict__ feat, const float* __restrict__ w,
                                         const float* __restrict__ bias, SmemT& s, const int* pix, int a, int b,
                                         float (&acc)[CU_MAX / 8][4], float (&acc_h)[kHeadTilesT][4]) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const float* wd = w + WOFF + ((a % K) * K + (b % K)) * CU * KP;  // [co][ci]
#pragma unroll
    for (int j = 0; j < CU / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    for (int k0 = 0; k0 < KP; k0 += kChunkT) {
        __syncthreads();  // the previous step's fragments are read (the first: the rows' pixel table is written)
        for (int v = threadIdx.x; v < kRowsT * (kChunkT / 4); v += kThreadsT) {
            const int r = v / (kChunkT / 4), k = k0 + (v % (kChunkT / 4)) * 4;
            float4 val = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (pix[r] >= 0 && k < CIN) val = __ldg(reinterpret_cast<const float4*>(feat + static_cast<long long>(pix[r]) * CIN + k));
            *reinterpret_cast<float4*>(&s.a[r][k - k0]) = val;
        }
        for (int v = threadIdx.x; v < CU * (kChunkT / 4); v += kThreadsT) {
            const int co = v / (kChunkT / 4), k = k0 + (v % (kChunkT / 4)) * 4;
            float4 val = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (k < KP) val = __ldg(reinterpret_cast<const float4*>(wd + co * KP + k));
            *reinterpret_cast<float4*>(&s.w[co][k - k0]) = val;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kChunkT; kk += 8) {
            unsigned fa[4];
            a_fragment(fa, &s.a[warp * 16 + g][kk + 2 * t], kPitchT);
#pragma unroll
            for (int j = 0; j < CU / 8; ++j) mma_step(acc[j], fa, &s.w[j * 8 + g][kk + 2 * t]);
        }
    }
    // u = tf32(relu(acc + bias)) as A fragments, times the head block W_i^T (NHP x CU) from global memory.
#pragma unroll
    for (int j = 0; j < CU / 8; ++j) {
        const float2 bu = __ldg(reinterpret_cast<const float2*>(bias + BOFF + j * 8 + 2 * t));
        const unsigned fa[4] = {to_tf32(fmaxf(acc[j][0] + bu.x, 0.0f)), to_tf32(fmaxf(acc[j][2] + bu.x, 0.0f)),
                                to_tf32(fmaxf(acc[j][1] + bu.y, 0.0f)), to_tf32(fmaxf(acc[j][3] + bu.y, 0.0f))};
#pragma unroll
        for (int h = 0; h < kHeadTilesT; ++h) {
            const float2 fb = __ldg(reinterpret_cast<const float2*>(w + HOFF + (h * 8 + g) * CU + j * 8 + 2 * t));
            mma1688(acc_h[h], fa, fb.x, fb.y);
        }
    }
}
}  // namespace

// grid (ceil(B * cells / 64), CELL * CELL), block 128.
extern "C" __global__ void __launch_bounds__(kThreadsT) neck_head_tf32(
        const float* __restrict__ x0, const float* __restrict__ x1, const float* __restrict__ x2,
        const float* __restrict__ w, const float* __restrict__ bias, float* __restrict__ out, int batch) {
    __shared__ __align__(16) SmemT s;
    const int a = blockIdx.y / CELL, b = blockIdx.y % CELL;
    const int warp = threadIdx.x / 32;
    gather_rows(s.pix, blockIdx.x * kRowsT, a, b, batch);
    float acc[CU_MAX / 8][4];
    float acc_h[kHeadTilesT][4];
    zero(acc_h);
    branch_t<BRANCH(0)>(x0, w, bias, s, s.pix[0], a, b, acc, acc_h);
#if NB > 1
    branch_t<BRANCH(1)>(x1, w, bias, s, s.pix[1], a, b, acc, acc_h);
#endif
#if NB > 2
    branch_t<BRANCH(2)>(x2, w, bias, s, s.pix[2], a, b, acc, acc_h);
#endif
    store_heads(acc_h, blockIdx.x * kRowsT + warp * 16, a, b, batch, bias, out);
}

#else
// ---------------------------------------------------------------------------------------------
// float32 inputs and weights, plain FMA in float32 (the IEEE fp32 precision), register-tiled as an
// SGEMM is: 256 threads, 64 rows; thread (tr, tc) = (tid / 16, tid % 16) owns rows 4 tr .. 4 tr + 3
// and, in a pass over 128 deconv channels, channels 4 tc .. 4 tc + 3 and 64 + 4 tc .. 64 + 4 tc + 3:
// per input channel one 16-byte load of its rows and two of its weights feed 32 FMAs. A step's inputs
// and weights (16 input channels) are loaded into registers while the step before it computes, then
// stored to the other of two shared-memory stages (one barrier a step). The pass's u (bias + ReLU)
// goes to shared memory, over the stages, and the thread adds its 4 rows x kHeadCols head channels
// (head_of: 4 consecutive ones per 64, one 16-byte weight load, then tc + 16 r past the last 64) of
// u W_i to registers that live across the branches, 4 channels of u at a time.
// ---------------------------------------------------------------------------------------------
namespace {
constexpr int kThreads = 256;
constexpr int kRows = 64;
constexpr int kChunk = 16;                 // input channels a step (KP is a multiple of 16)
constexpr int kPass = 128;                 // deconv channels a pass
constexpr int kRowPitch = kRows + 4;       // [k][row] and [c][row] arrays: 16-byte rows, fewer conflicts
constexpr int kHeadQuads = NHP / 64;               // head channels 64 q + 4 tc .. + 3 a thread,
constexpr int kHeadRest = (NHP % 64 + 15) / 16;     // then 64 kHeadQuads + tc + 16 r
constexpr int kHeadCols = 4 * kHeadQuads + kHeadRest;
constexpr int kHeadUnroll = 4;             // channels of u a head step (CU and kPass are multiples of 32)
constexpr int kWeightLoads = kChunk * kPass / 4 / kThreads;  // 16-byte weight loads a thread a step
static_assert(kThreads == NH_BLOCK_THREADS && kRows == NH_BLOCK_ROWS, "the launch shape of gpu/neck_head.py");
static_assert(kWeightLoads * kThreads * 4 == kChunk * kPass && kRows * kChunk == 4 * kThreads, "step shape");

// Head channel of a thread's accumulator column `col` (NHP is a multiple of 8: the quads are 16-byte aligned).
__device__ __forceinline__ int head_of(int col, int tc) {
    return col < 4 * kHeadQuads ? 64 * (col / 4) + 4 * tc + col % 4 : 64 * kHeadQuads + tc + 16 * (col - 4 * kHeadQuads);
}

struct Stage {
    float a[kChunk][kRowPitch];  // gathered input rows, transposed
    float w[kChunk][kPass];      // deconv weight slice [k][c]
};

struct Smem {
    union {
        Stage stage[2];              // a pass's steps, double-buffered
        float u[kPass][kRowPitch];   // then relu(deconv + bias) of the pass, transposed
    };
    int pix[3][kRows];
};

// One step's operands on their way to shared memory: 4 input values (NHWC: 4 channels of row tid / 4;
// NCHW: channels 4 (tid / 64) .. + 3 of row tid % 64, so a warp reads 32 rows of one channel) and
// kWeightLoads 16-byte pieces of the weight slice.
struct StepRegs {
    float a[4];
    float4 w[kWeightLoads];
};

template <int CIN, int KP, int CU, int K>
__device__ __forceinline__ void load_step(StepRegs& r, const float* __restrict__ feat, const float* __restrict__ wd,
                                          const int* pix, int k0, int c0) {
#if NH_IN_NCHW
    constexpr long long kPlane = static_cast<long long>(HY / K) * (HX / K);
    const int row = threadIdx.x % kRows, k = k0 + 4 * (threadIdx.x / kRows);
#pragma unroll
    for (int j = 0; j < 4; ++j)
        r.a[j] = pix[row] >= 0 && k + j < CIN ? __ldg(feat + pix[row] + (k + j) * kPlane) : 0.0f;
#else
    const int row = threadIdx.x / 4, k = k0 + (threadIdx.x % 4) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (pix[row] >= 0 && k < CIN) v = __ldg(reinterpret_cast<const float4*>(feat + static_cast<long long>(pix[row]) * CIN + k));
    r.a[0] = v.x, r.a[1] = v.y, r.a[2] = v.z, r.a[3] = v.w;
#endif
#pragma unroll
    for (int i = 0; i < kWeightLoads; ++i) {
        const int v = threadIdx.x + i * kThreads;
        const int kw = v / (kPass / 4), c = (v % (kPass / 4)) * 4;
        r.w[i] = c0 + c < CU ? __ldg(reinterpret_cast<const float4*>(wd + (k0 + kw) * CU + c0 + c))
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

__device__ __forceinline__ void store_step(const StepRegs& r, Stage& s) {
#if NH_IN_NCHW
    const int row = threadIdx.x % kRows, k = 4 * (threadIdx.x / kRows);
#else
    const int row = threadIdx.x / 4, k = (threadIdx.x % 4) * 4;
#endif
#pragma unroll
    for (int j = 0; j < 4; ++j) s.a[k + j][row] = r.a[j];
#pragma unroll
    for (int i = 0; i < kWeightLoads; ++i) {
        const int v = threadIdx.x + i * kThreads;
        *reinterpret_cast<float4*>(&s.w[v / (kPass / 4)][(v % (kPass / 4)) * 4]) = r.w[i];
    }
}

template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ void branch_f(const float* __restrict__ feat, const float* __restrict__ w,
                                         const float* __restrict__ bias, Smem& s, const int* pix, int a, int b,
                                         float (&acc_h)[4][kHeadCols]) {
    static_assert(CU % kHeadUnroll == 0 && kPass % kHeadUnroll == 0, "whole head steps");
    const int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
    const float* wd = w + WOFF + ((a % K) * K + (b % K)) * KP * CU;  // [ci][co]
    for (int c0 = 0; c0 < CU; c0 += kPass) {
        float acc[4][8];
        zero(acc);
        StepRegs next;
        load_step<CIN, KP, CU, K>(next, feat, wd, pix, 0, c0);
        __syncthreads();  // the previous pass's (or branch's) u, over the stages, is read
        store_step(next, s.stage[0]);
        __syncthreads();
        for (int k0 = 0, cur = 0; k0 < KP; k0 += kChunk, cur ^= 1) {
            const bool more = k0 + kChunk < KP;
            if (more) load_step<CIN, KP, CU, K>(next, feat, wd, pix, k0 + kChunk, c0);  // lands during this step
            const Stage& st = s.stage[cur];
#pragma unroll
            for (int k = 0; k < kChunk; ++k) {
                const float4 av = *reinterpret_cast<const float4*>(&st.a[k][4 * tr]);
                const float4 w0 = *reinterpret_cast<const float4*>(&st.w[k][4 * tc]);
                const float4 w1 = *reinterpret_cast<const float4*>(&st.w[k][64 + 4 * tc]);
                const float ar[4] = {av.x, av.y, av.z, av.w};
                const float wc[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(ar[i], wc[j], acc[i][j]);
            }
            if (more) store_step(next, s.stage[cur ^ 1]);  // read last in the step before this one
            __syncthreads();  // this step's stage is read (the last: u may overwrite the stages)
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int c = (j < 4 ? 4 * tc : 64 + 4 * tc) + (j & 3);
            const float bu = c0 + c < CU ? bias[BOFF + c0 + c] : 0.0f;
            *reinterpret_cast<float4*>(&s.u[c][4 * tr]) =
                make_float4(fmaxf(acc[0][j] + bu, 0.0f), fmaxf(acc[1][j] + bu, 0.0f), fmaxf(acc[2][j] + bu, 0.0f),
                            fmaxf(acc[3][j] + bu, 0.0f));
        }
        __syncthreads();
        const int width = min(kPass, CU - c0);
        for (int c1 = 0; c1 < width; c1 += kHeadUnroll) {
            float wv[kHeadUnroll][kHeadCols];
#pragma unroll
            for (int c = 0; c < kHeadUnroll; ++c) {
                const float* row = w + HOFF + (c0 + c1 + c) * NHP;
#pragma unroll
                for (int q = 0; q < kHeadQuads; ++q) {
                    const float4 v = __ldg(reinterpret_cast<const float4*>(row + 64 * q + 4 * tc));
                    wv[c][4 * q] = v.x, wv[c][4 * q + 1] = v.y, wv[c][4 * q + 2] = v.z, wv[c][4 * q + 3] = v.w;
                }
#pragma unroll
                for (int j = 4 * kHeadQuads; j < kHeadCols; ++j) {
                    const int h = head_of(j, tc);
                    wv[c][j] = h < NHP ? __ldg(row + h) : 0.0f;
                }
            }
#pragma unroll
            for (int c = 0; c < kHeadUnroll; ++c) {
                const float4 uv = *reinterpret_cast<const float4*>(&s.u[c1 + c][4 * tr]);
                const float ur[4] = {uv.x, uv.y, uv.z, uv.w};
#pragma unroll
                for (int j = 0; j < kHeadCols; ++j)
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc_h[i][j] = fmaf(ur[i], wv[c][j], acc_h[i][j]);
            }
        }
    }
}
}  // namespace

// grid (ceil(B * cells / 64), CELL * CELL), block 256.
extern "C" __global__ void __launch_bounds__(kThreads, 2) neck_head_f32(
        const float* __restrict__ x0, const float* __restrict__ x1, const float* __restrict__ x2,
        const float* __restrict__ w, const float* __restrict__ bias, float* __restrict__ out, int batch) {
    __shared__ __align__(16) Smem s;
    const int a = blockIdx.y / CELL, b = blockIdx.y % CELL;
    gather_rows(s.pix, blockIdx.x * kRows, a, b, batch);
    __syncthreads();  // the pixel table is written: each branch's first step loads before its first barrier
    float acc_h[4][kHeadCols];
    zero(acc_h);
    branch_f<BRANCH(0)>(x0, w, bias, s, s.pix[0], a, b, acc_h);
#if NB > 1
    branch_f<BRANCH(1)>(x1, w, bias, s, s.pix[1], a, b, acc_h);
#endif
#if NB > 2
    branch_f<BRANCH(2)>(x2, w, bias, s, s.pix[2], a, b, acc_h);
#endif
    const int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const Pixel p = tile_pixel(blockIdx.x * kRows + 4 * tr + i, a, b, batch);
        if (p.n < 0) continue;
        float* o = out + ((static_cast<long long>(p.n) * HY + p.y) * HX + p.x) * NH;
#pragma unroll
        for (int j = 0; j < kHeadCols; ++j) {
            const int h = head_of(j, tc);
            if (h < NH) o[h] = acc_h[i][j] + bias[HEAD_BIAS + h];
        }
    }
}
#endif
