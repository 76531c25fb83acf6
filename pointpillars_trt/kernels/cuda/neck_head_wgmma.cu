// The float16 neck and heads of neck_head.cu on Hopper (sm_90a), all on warpgroup MMA: the transposed
// convs as wgmma m64n128k16 (both operands from shared memory in the 128-byte swizzle), the heads as
// wgmma m64n72k16 with A from registers: u = half(relu(deconv + bias)) packed straight from the deconv's
// accumulators (the accumulator layout of m64nN is, warp by warp, the A fragment layout), so u never
// touches shared memory. The head channels run in tiles of 72 (zero weight rows past NHP).
//
// Persistent blocks with their weights resident: every pixel at one position (a, b) of the head-map
// cell reads the same deconv slices and head blocks, so a block takes one position (blockIdx.y), loads
// all of its weights into shared memory once, and its NH_WARPS / 4 warpgroups then walk tiles of 64
// rows (cells) of that position, gridDim.x * warpgroups tiles apart. (A block that loaded the weights
// once per tile read ~170 KB of weights from L2 for 64 rows.) A warpgroup streams only its rows' input
// pixels, per branch in chunks of 64 channels, through a cp.async ring of NH_STAGES stages of its own
// (synchronised on a named barrier of its 128 threads). A pixel's sums run over the same chunks in the
// same order wherever it falls, so a frame's heads do not depend on the batch or on the grid.
//
// Compile-time configuration: neck_head.cu's defines with USE_MMA = 1, every B{i}_CU = 128, NH_WARPS a
// multiple of 4, NH_SMEM = the resident weights + the warpgroups' stages + 1024 (alignment)
// (gpu/neck_head.py computes it). Float16 values travel as 16-bit words: no header of the CUDA toolkit.
#include "mma_sync.cuh"
#include "neck_head_common.cuh"
#include "wgmma.cuh"

namespace {
constexpr int kWarpgroups = NH_WARPS / 4;
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kRows = 64;             // a tile: one warpgroup's m64
constexpr int kStages = NH_STAGES;    // of each warpgroup's ring
constexpr int kUp = 128;              // upsampled channels of every branch: the deconv wgmma's N
constexpr int kABytes = kRows * 128;  // a stage: 64 rows x 64 channels
constexpr int kWBytes = kUp * 128;    // a chunk's deconv slice: 128 x 64 channels
constexpr int kHeadN = 72;            // head channels a head wgmma (its N)
constexpr int kHeadTiles = (NHP + kHeadN - 1) / kHeadN;
constexpr int kHeadHalfBytes = kHeadN * 128;        // a head tile's weights for 64 of the 128 channels, swizzled
constexpr int kHeadBytes = kHeadTiles * 2 * kHeadHalfBytes;  // a branch's head block
constexpr int kChunks = kChunks0 + kChunks1 + kChunks2;      // a tile's steps
constexpr int kStageBase = kChunks * kWBytes;
constexpr int kHeadBase = kStageBase + kWarpgroups * kStages * kABytes;
static_assert(USE_MMA && NH_WARPS % 4 == 0 && kThreads == NH_BLOCK_THREADS, "the launch shape of gpu/neck_head.py");
static_assert(B0_CU == kUp && CU_MAX == kUp, "128 upsampled channels a branch");
#if NB > 1
static_assert(B1_CU == kUp, "128 upsampled channels a branch");
#endif
#if NB > 2
static_assert(B2_CU == kUp, "128 upsampled channels a branch");
#endif
static_assert(kStages >= 2 && kHeadBase + NB * kHeadBytes + 1024 == NH_SMEM, "NH_SMEM of gpu/neck_head.py");

typedef unsigned short half_bits;

// Where 16-byte piece `piece` (0..7) of row `row` of a swizzled tile lies.
__device__ __forceinline__ unsigned char* swizzled(unsigned char* tile, int row, int piece) {
    return tile + row * 128 + ((piece ^ (row & 7)) << 4);
}

// The 128 threads of warpgroup `wg` meet (barrier 0 is __syncthreads).
__device__ __forceinline__ void warpgroup_sync(int wg) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(wg + 1) : "memory");
}

struct Ctx {
    const half_bits* x0;
    const half_bits* x1;
    const half_bits* x2;
    const half_bits* w;
    const float* bias;
    unsigned char* smem;  // the resident deconv slices, the stages, the head blocks; 1024-byte aligned
    int a, b, batch;
    int wg, lane;         // warpgroup; thread within it (0..127)
    int first_tile, tile_step, steps;  // this warpgroup's tiles and its ring's steps (tiles x kChunks)
};

// Branch i's deconv slices of position (a, b), chunk by chunk (128 x 64 channels each, from chunk tile
// `first` of the resident weights; zeros past the channels there are), and its head block (head block
// `index`: per tile of 72 head channels, channels 0-63 then 64-127, zero rows past NHP). The whole block.
template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ void load_weights(const Ctx& cx, int first, int index) {
    const half_bits* wd = cx.w + WOFF + ((cx.a % K) * K + (cx.b % K)) * CU * KP;  // [co][ci]
    for (int v = threadIdx.x; v < chunks_of(KP) * kUp * 8; v += kThreads) {
        const int chunk = v / (kUp * 8), row = (v / 8) % kUp, piece = v % 8;
        const int c = chunk * kChunk + piece * 8;
        const bool ok = c < KP;
        cp_async16(swizzled(cx.smem + (first + chunk) * kWBytes, row, piece), ok ? wd + row * KP + c : cx.w, ok ? 16 : 0);
    }
    unsigned char* head = cx.smem + kHeadBase + index * kHeadBytes;
    for (int v = threadIdx.x; v < kHeadTiles * 2 * kHeadN * 8; v += kThreads) {
        const int half_tile = v / (kHeadN * 8), row = (v / 8) % kHeadN, piece = v % 8;
        const int h = (half_tile / 2) * kHeadN + row, c = (half_tile % 2) * 64 + piece * 8;
        const bool ok = h < NHP;
        cp_async16(swizzled(head + half_tile * kHeadHalfBytes, row, piece), ok ? cx.w + HOFF + h * CU + c : cx.w,
                   ok ? 16 : 0);
    }
}

// Chunk `chunk` of branch i for tile `tile`: its rows' input channels [64 chunk, 64 chunk + 64), zeros
// past the channels there are and for rows past the batch or the map. One warpgroup.
template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ void load_rows(int tile, int chunk, const half_bits* __restrict__ feat, const Ctx& cx,
                                          unsigned char* st) {
    const int piece = cx.lane % 8;
    const int c = chunk * kChunk + piece * 8;
#pragma unroll
    for (int j = 0; j < kRows * 8 / 128; ++j) {
        const int row = cx.lane / 8 + j * 16;
        const int px = input_pixel<CIN, KP, CU, K, WOFF, BOFF, HOFF>(tile_pixel(tile * kRows + row, cx.a, cx.b, cx.batch));
        const bool ok = px >= 0 && c < CIN;
        cp_async16(swizzled(st, row, piece), ok ? feat + static_cast<long long>(px) * CIN + c : feat, ok ? 16 : 0);
    }
}

__device__ __forceinline__ unsigned char* stage_of(int step, const Ctx& cx) {
    return cx.smem + kStageBase + (cx.wg * kStages + step % kStages) * kABytes;
}

// Issue the loads of this warpgroup's step `step` (if any) into its stage, then commit a group (possibly
// empty: the wait counts assume one group a step).
__device__ __forceinline__ void issue(int step, const Ctx& cx) {
    if (step < cx.steps) {
        const int tile = cx.first_tile + (step / kChunks) * cx.tile_step;
        const int chunk = step % kChunks;
        unsigned char* st = stage_of(step, cx);
        if (chunk < kChunks0) {
            load_rows<BRANCH(0)>(tile, chunk, cx.x0, cx, st);
        }
#if NB > 1
        else if (chunk < kChunks0 + kChunks1) {
            load_rows<BRANCH(1)>(tile, chunk - kChunks0, cx.x1, cx, st);
        }
#endif
#if NB > 2
        else {
            load_rows<BRANCH(2)>(tile, chunk - kChunks0 - kChunks1, cx.x2, cx, st);
        }
#endif
    }
    cp_async_commit();
}

// Wait until step `step`'s stage is complete for the whole warpgroup; returns it. The caller then puts
// step + kStages - 1 in flight (into the stage of step - 1) once nothing reads that stage any more.
__device__ __forceinline__ unsigned char* ready(int step, const Ctx& cx) {
    cp_async_wait<kStages - 2>();
    fence_async_shared();
    warpgroup_sync(cx.wg);
    return stage_of(step, cx);
}

// Branch i of one tile: its chunks on wgmma against the resident slices from chunk tile `first`, then
// its head products against head block `index`, added to acc_h (left in flight: the next wgmma wait
// covers them).
template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ void branch(int& step, const Ctx& cx, int first, int index,
                                       float (&acc_h)[kHeadTiles][kHeadN / 2]) {
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    for (int chunk = 0; chunk < chunks_of(KP); ++chunk, ++step) {
        unsigned char* st = ready(step, cx);
        const unsigned long long da = smem_desc(smem_addr(st));
        const unsigned long long db = smem_desc(smem_addr(cx.smem + (first + chunk) * kWBytes));
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kChunk / 16; ++kk) {  // 16 channels = 32 bytes = 2 in the descriptor's units
            wgmma_m64n128(acc, da + 2 * kk, db + 2 * kk, chunk > 0 || kk > 0);
        }
        wgmma_commit();
        wgmma_wait<1>();         // the previous chunk's products are done (in every warp after the barrier),
        warpgroup_sync(cx.wg);   // so its stage is refilled while this chunk's are computed
        issue(step + kStages - 1, cx);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i])::"memory");  // read only after the wait

    // u as A fragments: register 4 j + e of m64n128 is column 8 j + 2 t + e % 2 of row g (+ 8 for e >= 2),
    // so registers 8 j .. 8 j + 7 are the m64k16 fragment of channels 16 j .. 16 j + 15.
    unsigned fa[kUp / 16][4];
#pragma unroll
    for (int j = 0; j < kUp / 16; ++j) u_fragment<BOFF>(acc, cx.bias, j, cx.lane % 4, fa[j]);
    wgmma_fence();
    const unsigned long long dh = smem_desc(smem_addr(cx.smem + kHeadBase + index * kHeadBytes));
#pragma unroll
    for (int ht = 0; ht < kHeadTiles; ++ht) {
#pragma unroll
        for (int j = 0; j < kUp / 16; ++j) {  // channels 16 j: half tile j / 4, 32 bytes (2 units) a step in it
            const unsigned long long d = dh + ((2 * ht + j / 4) * kHeadHalfBytes >> 4) + 2 * (j % 4);
            wgmma_m64n72_rs(acc_h[ht], fa[j], d, index > 0 || j > 0);
        }
    }
    wgmma_commit();
}

// A warpgroup's head sums (+ the head bias) into the NHWC output: acc_h in the wgmma accumulator layout,
// which is, per 8 head channels, the m16n8 C fragment layout that store_heads reads.
__device__ __forceinline__ void store_tile(const float (&acc_h)[kHeadTiles][kHeadN / 2], int row0, const Ctx& cx,
                                           float* __restrict__ out) {
    float frag[NHP / 8][4];
#pragma unroll
    for (int h = 0; h < NHP / 8; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) frag[h][e] = acc_h[h / (kHeadN / 8)][(h % (kHeadN / 8)) * 4 + e];
    store_heads(frag, row0, cx.a, cx.b, cx.batch, cx.bias, out);
}
}  // namespace

// grid (blocks a position, CELL * CELL), block 128 * warpgroups threads, NH_SMEM bytes of dynamic shared
// memory (one block an SM).
extern "C" __global__ void __launch_bounds__(kThreads, NH_MIN_BLOCKS) neck_head_wgmma(
        const half_bits* __restrict__ x0, const half_bits* __restrict__ x1, const half_bits* __restrict__ x2,
        const half_bits* __restrict__ w, const float* __restrict__ bias, float* __restrict__ out, int batch) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - smem_addr(smem_raw) % 1024) % 1024);  // the swizzle's period
    const int wg = threadIdx.x / 128;
    const int tiles = (batch * kCellsY * kCellsX + kRows - 1) / kRows;
    const int first_tile = wg * gridDim.x + blockIdx.x;  // a block's first warpgroup first: spread over the SMs
    const int tile_step = gridDim.x * kWarpgroups;
    const int my_tiles = first_tile < tiles ? (tiles - first_tile + tile_step - 1) / tile_step : 0;
    const Ctx cx{x0, x1, x2, w, bias, smem, static_cast<int>(blockIdx.y) / CELL, static_cast<int>(blockIdx.y) % CELL,
                 batch, wg, static_cast<int>(threadIdx.x) % 128, first_tile, tile_step, my_tiles * kChunks};

    load_weights<BRANCH(0)>(cx, 0, 0);
#if NB > 1
    load_weights<BRANCH(1)>(cx, kChunks0, 1);
#endif
#if NB > 2
    load_weights<BRANCH(2)>(cx, kChunks0 + kChunks1, 2);
#endif
    cp_async_commit();
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s, cx);  // the rows stream in while the weights arrive
    cp_async_wait<kStages - 1>();                          // this thread's weights (the oldest group)
    fence_async_shared();
    __syncthreads();                                       // everyone's

    int step = 0;
    for (int t = 0; t < my_tiles; ++t) {
        float acc_h[kHeadTiles][kHeadN / 2];
#pragma unroll
        for (int ht = 0; ht < kHeadTiles; ++ht)
#pragma unroll
            for (int i = 0; i < kHeadN / 2; ++i) acc_h[ht][i] = 0.0f;
        branch<BRANCH(0)>(step, cx, 0, 0, acc_h);
#if NB > 1
        branch<BRANCH(1)>(step, cx, kChunks0, 1, acc_h);
#endif
#if NB > 2
        branch<BRANCH(2)>(step, cx, kChunks0 + kChunks1, 2, acc_h);
#endif
        wgmma_wait<0>();
#pragma unroll
        for (int ht = 0; ht < kHeadTiles; ++ht)
#pragma unroll
            for (int i = 0; i < kHeadN / 2; ++i) asm volatile("" : "+f"(acc_h[ht][i])::"memory");
        store_tile(acc_h, (first_tile + t * tile_step) * kRows + (cx.lane / 32) * 16, cx, out);
    }
    cp_async_wait<0>();  // only empty groups remain; leave none in flight at exit
}
