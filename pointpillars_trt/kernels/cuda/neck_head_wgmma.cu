// The float16 neck and heads of neck_head.cu on Hopper (sm_90a): the transposed convs on warpgroup MMA
// (wgmma m64n128k16, both operands from shared memory in the 128-byte swizzle), the heads on mma.sync
// as in neck_head_f16, fed from the wgmma accumulators in registers (the accumulator layout of
// m64nN is, warp by warp, the A fragment layout of m16n8k16), so u never touches shared memory.
//
// Block: NH_WARPS / 4 warpgroups, 64 tile rows each (cells at one position (a, b) in the head-map
// cell, as neck_head_f16's block). The block walks neck_head_f16's steps: per branch, its input
// channels in chunks of 64 (A: the rows' gathered input pixels, W: the 128 x 64 deconv weight slice,
// both 128-byte rows, swizzled), then one head step (W: the branch's NHP x 128 head block, padded
// rows for ldmatrix); NH_STAGES - 1 steps in flight by cp.async in a ring of NH_STAGES stages, a stage
// refilled while the next chunk's products are computed. A pixel's sums run over the same chunks in the
// same order wherever it falls, so a frame's heads do not depend on the batch.
//
// Compile-time configuration: neck_head.cu's defines with USE_MMA = 1, every B{i}_CU = 128, NH_WARPS a
// multiple of 4, NH_SMEM = NH_STAGES stage bytes + 1024 (alignment) + the rows' pixel indices
// (gpu/neck_head.py computes it). Float16 values travel as 16-bit words: no header of the CUDA toolkit.
#include "mma_sync.cuh"
#include "neck_head_common.cuh"
#include "wgmma.cuh"

namespace {
constexpr int kWarpgroups = NH_WARPS / 4;
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kRows = 64 * kWarpgroups;
constexpr int kStages = NH_STAGES;
constexpr int kUp = 128;              // upsampled channels of every branch: the wgmma's N
constexpr int kHPitch = kUp + 8;      // head weight rows (halves): ldmatrix's 8 row reads in distinct banks
constexpr int kHeadTiles = NHP / 8;
constexpr int kABytes = kRows * 128;
constexpr int kWBytes = kUp * 128;
constexpr int kHeadBytes = NHP * kHPitch * 2;
constexpr int kStageBytes = ((kABytes + kWBytes > kHeadBytes ? kABytes + kWBytes : kHeadBytes) + 1023) / 1024 * 1024;
constexpr int kPieces = kRows * 8 / kThreads;  // 16-byte pieces of A a thread loads a step (4)
static_assert(USE_MMA && NH_WARPS % 4 == 0 && kThreads == NH_BLOCK_THREADS && kRows == NH_BLOCK_ROWS,
              "the launch shape of gpu/neck_head.py");
static_assert(B0_CU == kUp && CU_MAX == kUp, "128 upsampled channels a branch");
#if NB > 1
static_assert(B1_CU == kUp, "128 upsampled channels a branch");
#endif
#if NB > 2
static_assert(B2_CU == kUp, "128 upsampled channels a branch");
#endif
static_assert(kStages >= 2 && kStages * kStageBytes + 1024 + 3 * kRows * 4 == NH_SMEM, "NH_SMEM of gpu/neck_head.py");

typedef unsigned short half_bits;

// Where 16-byte piece `piece` (0..7) of row `row` of a swizzled tile lies.
__device__ __forceinline__ unsigned char* swizzled(unsigned char* tile, int row, int piece) {
    return tile + row * 128 + ((piece ^ (row & 7)) << 4);
}

struct Ctx {
    const half_bits* x0;
    const half_bits* x1;
    const half_bits* x2;
    const half_bits* w;
    const float* bias;
    unsigned char* smem;  // the stages, 1024-byte aligned
    const RowPixels<kRows>* rows;
    int a, b;
};

// Step `chunk` of a branch: its rows' input channels [64 chunk, 64 chunk + 64) and the deconv weight
// slice of position (a, b) for them, zeros past the channels there are.
template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ void load_chunk(int chunk, const half_bits* __restrict__ feat, const Ctx& cx,
                                           const int* pix, unsigned char* st) {
    const int piece = threadIdx.x % 8;
    const int c = chunk * kChunk + piece * 8;
#pragma unroll
    for (int j = 0; j < kPieces; ++j) {
        const int row = threadIdx.x / 8 + j * (kThreads / 8);
        const int px = pix[row];
        const bool ok = px >= 0 && c < CIN;
        cp_async16(swizzled(st, row, piece), ok ? feat + static_cast<long long>(px) * CIN + c : feat, ok ? 16 : 0);
    }
    const half_bits* wd = cx.w + WOFF + ((cx.a % K) * K + (cx.b % K)) * CU * KP;  // [co][ci]
#pragma unroll
    for (int j = 0; j < kUp * 8 / kThreads; ++j) {
        const int row = threadIdx.x / 8 + j * (kThreads / 8);
        const bool ok = c < KP;
        cp_async16(swizzled(st + kABytes, row, piece), ok ? wd + row * KP + c : cx.w, ok ? 16 : 0);
    }
}

template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ void load_head(const Ctx& cx, unsigned char* st) {
    half_bits* sw = reinterpret_cast<half_bits*>(st);
    constexpr int kVecs = kUp / 8;
    for (int v = threadIdx.x; v < NHP * kVecs; v += kThreads) {
        const int h = v / kVecs, c = (v % kVecs) * 8;
        cp_async16(sw + h * kHPitch + c, cx.w + HOFF + h * CU + c, 16);
    }
}

template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ void load_step(int step, const half_bits* __restrict__ feat, const Ctx& cx, const int* pix,
                                          unsigned char* st) {
    if (step < chunks_of(KP)) {
        load_chunk<CIN, KP, CU, K, WOFF, BOFF, HOFF>(step, feat, cx, pix, st);
    } else {
        load_head<CIN, KP, CU, K, WOFF, BOFF, HOFF>(cx, st);
    }
}

// Issue the loads of global step `step` (if any) into its stage, then commit a group (possibly empty:
// the wait counts assume one group a step).
__device__ __forceinline__ void issue(int step, const Ctx& cx) {
    unsigned char* st = cx.smem + (step % kStages) * kStageBytes;
    if (step < kSteps0) {
        load_step<BRANCH(0)>(step, cx.x0, cx, cx.rows->pix[0], st);
    }
#if NB > 1
    else if (step < kSteps0 + kSteps1) {
        load_step<BRANCH(1)>(step - kSteps0, cx.x1, cx, cx.rows->pix[1], st);
    }
#endif
#if NB > 2
    else if (step < kSteps) {
        load_step<BRANCH(2)>(step - kSteps0 - kSteps1, cx.x2, cx, cx.rows->pix[2], st);
    }
#endif
    cp_async_commit();
}

// Wait until step `step`'s stage is complete for every thread; returns it. The caller then puts step +
// kStages - 1 in flight (into the stage of step - 1) once nothing reads that stage any more.
__device__ __forceinline__ unsigned char* ready(int step, const Ctx& cx) {
    cp_async_wait<kStages - 2>();
    fence_async_shared();
    __syncthreads();
    return cx.smem + (step % kStages) * kStageBytes;
}

template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ void branch(int& step, const Ctx& cx, float (&acc_h)[kHeadTiles][4]) {
    const int wg = threadIdx.x / 128;
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    for (int chunk = 0; chunk < chunks_of(KP); ++chunk, ++step) {
        unsigned char* st = ready(step, cx);
        const unsigned long long da = smem_desc(smem_addr(st + wg * 64 * 128));
        const unsigned long long db = smem_desc(smem_addr(st + kABytes));
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kChunk / 16; ++kk) {  // 16 channels = 32 bytes = 2 in the descriptor's units
            wgmma_m64n128(acc, da + 2 * kk, db + 2 * kk, chunk > 0 || kk > 0);
        }
        wgmma_commit();
        wgmma_wait<1>();  // the previous chunk's products are done (in every warpgroup after the barrier),
        __syncthreads();  // so its stage is refilled while this chunk's are computed
        issue(step + kStages - 1, cx);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i])::"memory");  // read only after the wait

    // Head step: register 4 j + e of m64n128 is column 8 j + 2 t + e % 2 of row g (+ 8 for e >= 2): warp
    // by warp, neck_head_f16's accumulator layout.
    const half_bits* sh = reinterpret_cast<const half_bits*>(ready(step, cx));
    issue(step + kStages - 1, cx);  // the last chunk's products are done in every warpgroup (the barrier)
    ++step;
    head_step<CU, BOFF>(acc, cx.bias, sh, acc_h);
}
}  // namespace

// grid (ceil(B * cells / BM), CELL * CELL), block 32 NH_WARPS, NH_SMEM bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(kThreads, NH_MIN_BLOCKS) neck_head_wgmma(
        const half_bits* __restrict__ x0, const half_bits* __restrict__ x1, const half_bits* __restrict__ x2,
        const half_bits* __restrict__ w, const float* __restrict__ bias, float* __restrict__ out, int batch) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - smem_addr(smem_raw) % 1024) % 1024);  // the swizzle's period
    RowPixels<kRows>& rows = *reinterpret_cast<RowPixels<kRows>*>(smem + kStages * kStageBytes);
    const int a = blockIdx.y / CELL, b = blockIdx.y % CELL;
    gather_rows(rows.pix, blockIdx.x * kRows, a, b, batch);
    __syncthreads();
    const Ctx cx{x0, x1, x2, w, bias, smem, &rows, a, b};
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s, cx);

    float acc_h[kHeadTiles][4];
    zero(acc_h);
    int step = 0;
    branch<BRANCH(0)>(step, cx, acc_h);
#if NB > 1
    branch<BRANCH(1)>(step, cx, acc_h);
#endif
#if NB > 2
    branch<BRANCH(2)>(step, cx, acc_h);
#endif
    cp_async_wait<0>();  // only empty groups remain; leave none in flight at exit
    store_heads(acc_h, blockIdx.x * kRows + (threadIdx.x / 32) * 16, a, b, batch, bias, out);
}
