// The float16 neck and heads of neck_head.cu on Hopper (sm_90a): the transposed convs on warpgroup MMA
// (wgmma m64n128k16, both operands from shared memory in the 128-byte swizzle), the heads on mma.sync
// as in neck_head_f16, fed from the wgmma accumulators in registers (the accumulator layout of
// m64nN is, warp by warp, the A fragment layout of m16n8k16), so u never touches shared memory.
//
// Block: NH_WARPS / 4 warpgroups, 64 tile rows each (cells at one position (a, b) in the head-map
// cell, as neck_head_f16's block). The block walks neck_head_f16's steps: per branch, its input
// channels in chunks of 64 (A: the rows' gathered input pixels, W: the 128 x 64 deconv weight slice,
// both 128-byte rows, swizzled), then one head step (W: the branch's NHP x 128 head block, padded
// rows for ldmatrix); NH_STAGES - 1 steps in flight by cp.async in a ring of NH_STAGES stages. A
// pixel's sums run over the same chunks in the same order wherever it falls, so a frame's heads do
// not depend on the batch.
//
// Compile-time configuration: neck_head.cu's defines with USE_MMA = 1, every B{i}_CU = 128, NH_WARPS a
// multiple of 4, NH_SMEM = NH_STAGES stage bytes + 1024 (alignment) + the rows' pixel indices
// (gpu/neck_head.py computes it). Float16 values travel as 16-bit words: no header of the CUDA toolkit.
#include "neck_head_common.cuh"
#include "mma_sync.cuh"

namespace {
constexpr int kWarpgroups = NH_WARPS / 4;
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kRows = 64 * kWarpgroups;
constexpr int kStages = NH_STAGES;
constexpr int kChunk = 64;            // input channels a step: 128 bytes, the swizzle's row
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
static_assert(B0_CU == kUp, "128 upsampled channels a branch");
#if NB > 1
static_assert(B1_CU == kUp, "128 upsampled channels a branch");
#endif
#if NB > 2
static_assert(B2_CU == kUp, "128 upsampled channels a branch");
#endif
static_assert(kStages >= 2 && kStages * kStageBytes + 1024 + 3 * kRows * 4 == NH_SMEM, "NH_SMEM of gpu/neck_head.py");

typedef unsigned short half_bits;

__host__ __device__ constexpr int chunks_of(int kp) { return (kp + kChunk - 1) / kChunk; }
constexpr int kSteps0 = chunks_of(B0_KP) + 1;
#if NB > 1
constexpr int kSteps1 = chunks_of(B1_KP) + 1;
#else
constexpr int kSteps1 = 0;
#endif
#if NB > 2
constexpr int kSteps2 = chunks_of(B2_KP) + 1;
#else
constexpr int kSteps2 = 0;
#endif
constexpr int kSteps = kSteps0 + kSteps1 + kSteps2;

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// cp.async's shared-memory writes made visible to wgmma's async proxy.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// A K-major operand in the 128-byte swizzle: rows of 128 bytes, 8-row groups 1024 bytes apart.
__device__ __forceinline__ unsigned long long smem_desc(unsigned addr) {
    unsigned long long d = static_cast<unsigned long long>((addr & 0x3FFFF) >> 4);
    d |= static_cast<unsigned long long>(1) << 16;          // leading byte offset (unused by this mode)
    d |= static_cast<unsigned long long>(1024 >> 4) << 32;  // stride byte offset: 8 rows
    d |= static_cast<unsigned long long>(1) << 62;          // 128-byte swizzle
    return d;
}

// Where 16-byte piece `piece` (0..7) of row `row` of a swizzled tile lies.
__device__ __forceinline__ unsigned char* swizzled(unsigned char* tile, int row, int piece) {
    return tile + row * 128 + ((piece ^ (row & 7)) << 4);
}

// d (+)= A B, 64 rows x 128 channels x 16 input channels; accumulate = 0 overwrites d.
__device__ __forceinline__ void wgmma_m64n128(float (&d)[64], unsigned long long desc_a, unsigned long long desc_b,
                                              int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
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

// Wait for step `step`'s stage, then put step + kStages - 1 in flight; returns the stage to read.
__device__ __forceinline__ unsigned char* advance(int step, const Ctx& cx) {
    cp_async_wait<kStages - 2>();
    fence_async_shared();
    __syncthreads();  // the stage is complete for every thread, and the one refilled below is read by none
    issue(step + kStages - 1, cx);
    return cx.smem + (step % kStages) * kStageBytes;
}

template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ void branch(int& step, const Ctx& cx, float (&acc_h)[kHeadTiles][4]) {
    const int lane = threadIdx.x % 32, wg = threadIdx.x / 128, t = lane % 4;
    const int lr = lane % 8, lm = lane / 8;
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    for (int chunk = 0; chunk < chunks_of(KP); ++chunk, ++step) {
        unsigned char* st = advance(step, cx);
        const unsigned long long da = smem_desc(smem_addr(st + wg * 64 * 128));
        const unsigned long long db = smem_desc(smem_addr(st + kABytes));
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kChunk / 16; ++kk) {  // 16 channels = 32 bytes = 2 in the descriptor's units
            wgmma_m64n128(acc, da + 2 * kk, db + 2 * kk, chunk > 0 || kk > 0);
        }
        wgmma_commit();
        wgmma_wait_all();  // done before the next advance refills a stage it may read
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i])::"memory");  // read only after the wait

    // Head step: u = half(relu(acc + bias)) as A fragments (register 4 j + e of m64n128 is column 8 j +
    // 2 t + e % 2 of row g, + 8 for e >= 2), times the head block W_i^T (NHP x 128).
    const half_bits* sh = reinterpret_cast<const half_bits*>(advance(step, cx));
    ++step;
#pragma unroll
    for (int j = 0; j < kUp / 16; ++j) {
        const int c = j * 16 + 2 * t;
        const float2 b_lo = *reinterpret_cast<const float2*>(cx.bias + BOFF + c);
        const float2 b_hi = *reinterpret_cast<const float2*>(cx.bias + BOFF + c + 8);
        unsigned fa[4];
        fa[0] = pack_relu(acc[8 * j] + b_lo.x, acc[8 * j + 1] + b_lo.y);
        fa[1] = pack_relu(acc[8 * j + 2] + b_lo.x, acc[8 * j + 3] + b_lo.y);
        fa[2] = pack_relu(acc[8 * j + 4] + b_hi.x, acc[8 * j + 5] + b_hi.y);
        fa[3] = pack_relu(acc[8 * j + 6] + b_hi.x, acc[8 * j + 7] + b_hi.y);
        const half_bits* pb = sh + ((lm >> 1) * 8 + lr) * kHPitch + j * 16 + (lm & 1) * 8;
#pragma unroll
        for (int h = 0; h + 1 < kHeadTiles; h += 2) {
            unsigned fb[4];
            ldsm_x4(fb, pb + h * 8 * kHPitch);
            mma16816(acc_h[h], fa, fb[0], fb[1]);
            mma16816(acc_h[h + 1], fa, fb[2], fb[3]);
        }
        if (kHeadTiles % 2) {
            unsigned fb[2];
            ldsm_x2(fb, sh + ((kHeadTiles - 1) * 8 + lr) * kHPitch + j * 16 + (lm & 1) * 8);
            mma16816(acc_h[kHeadTiles - 1], fa, fb[0], fb[1]);
        }
    }
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
