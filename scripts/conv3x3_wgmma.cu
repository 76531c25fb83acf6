// 3 x 3 convolution (padding 1, stride CONV_STRIDE) + bias + ReLU on Hopper tensor cores (wgmma):
// float16 NHWC in and out (as 16-bit words: the file is compiled for sm_90a without an include path),
// float32 accumulation. An implicit GEMM: M = the output pixels, N = the output channels, K = 9 taps
// x CIN input channels, tap-major as the KRSC filter (cuDNN's NHWC filter) is stored.
//
// A block computes BM pixels x BN channels with BM / 64 warpgroups (64 rows each). K is walked in
// chunks of 64 channels of one tap (128 bytes a row, the width of the 128-byte swizzle): a chunk's A
// rows (each output pixel's input pixel under the tap, zeros outside the map) and B rows (the
// filter's output channels) are cp.async'ed into shared memory in the layout wgmma's 128-byte
// swizzle reads, CONV_STAGES - 1 chunks ahead; wgmma reads both operands from shared memory. A
// pixel's sum runs over the same chunks in the same order whatever the batch or the block it falls
// in, so a frame's output does not depend on the batch.
//
// Compile-time configuration (-D options from scripts/probe_conv_wgmma.py): CIN, COUT (multiples of 64),
// CONV_STRIDE, H_IN, W_IN, H_OUT, W_OUT, BM (64 | 128), BN (64 | 128), CONV_STAGES (>= 2). The
// batch is a kernel argument.
#include "wgmma.cuh"

namespace {
constexpr int kBK = 64;                       // channels a chunk: 128 bytes a row
constexpr int kWarpgroups = BM / 64;
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kChunksPerTap = CIN / kBK;
constexpr int kChunks = 9 * kChunksPerTap;
constexpr int kABytes = BM * 128;
constexpr int kBBytes = BN * 128;
constexpr int kStageBytes = kABytes + kBBytes;
constexpr int kARowsPerThread = BM * 8 / kThreads;   // 16-byte pieces of A a thread loads a chunk (4)
constexpr int kBRowsPerThread = BN * 8 / kThreads;
constexpr int kAcc = BN / 2;                  // float32 accumulators a thread (m64nBN: 64 x BN / 128)
static_assert(CIN % kBK == 0 && COUT % BN == 0, "channels in whole chunks and tiles");
static_assert((BM == 64 || BM == 128) && (BN == 64 || BN == 128), "tile shape");
static_assert(CONV_STAGES >= 2, "pipeline depth");

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// float16 <-> float32 without cuda_fp16.h (this file is compiled for sm_90a with no include path).
__device__ __forceinline__ float half_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
    return f;
}
// Two float32 rounded to float16 (nearest even): lo in the low half.
__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// The 16-byte piece `piece` (0..7) of row `row` in a swizzled tile.
__device__ __forceinline__ unsigned swizzled(unsigned tile, int row, int piece) {
    return tile + row * 128 + ((piece ^ (row & 7)) << 4);
}

// d (+)= A B for a 64 x BN tile and 16 channels: A and B in shared memory (descriptors), d in the
// accumulator layout of m64nBNk16; accumulate = 0 overwrites d.
#if BN == 64
__device__ __forceinline__ void wgmma_tile(float (&d)[32], unsigned long long desc_a, unsigned long long desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
#else
__device__ __forceinline__ void wgmma_tile(float (&d)[64], unsigned long long desc_a, unsigned long long desc_b, int accumulate) {
    wgmma_m64n128(d, desc_a, desc_b, accumulate);
}
#endif
}  // namespace

// grid (ceil(batch * H_OUT * W_OUT / BM), COUT / BN), block BM / 64 * 128 threads,
// CONV_STAGES * (BM + BN) * 128 + 1024 bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(kThreads) conv3x3_wgmma(
        const unsigned short* __restrict__ x, const unsigned short* __restrict__ w,
        const unsigned short* __restrict__ bias, unsigned short* __restrict__ y, int batch) {
    extern __shared__ unsigned char smem_raw[];
    const unsigned smem = (smem_u32(smem_raw) + 1023u) & ~1023u;  // the swizzle repeats every 1024 bytes
    const int tid = threadIdx.x;
    const int m_total = batch * H_OUT * W_OUT;
    const int m0 = blockIdx.x * BM;
    const int n0 = blockIdx.y * BN;
    const int piece = tid % 8;

    // This thread's A rows: the output pixel's top-left input position (tap 0), or a row of zeros.
    int a_base[kARowsPerThread];
    int a_y[kARowsPerThread], a_x[kARowsPerThread];
#pragma unroll
    for (int j = 0; j < kARowsPerThread; ++j) {
        const int m = m0 + tid / 8 + j * (kThreads / 8);
        if (m < m_total) {
            const int n = m / (H_OUT * W_OUT);
            const int rem = m - n * (H_OUT * W_OUT);
            const int oy = rem / W_OUT, ox = rem - (rem / W_OUT) * W_OUT;
            a_y[j] = oy * CONV_STRIDE - 1;
            a_x[j] = ox * CONV_STRIDE - 1;
            a_base[j] = n * H_IN * W_IN;
        } else {
            a_y[j] = -1000000;  // every tap out of the map
            a_x[j] = 0;
            a_base[j] = 0;
        }
    }

    auto load_chunk = [&](int chunk) {
        const unsigned st = smem + (chunk % CONV_STAGES) * kStageBytes;
        const int tap = chunk / kChunksPerTap;
        const int c0 = (chunk - tap * kChunksPerTap) * kBK + piece * 8;
        const int ky = tap / 3, kx = tap - (tap / 3) * 3;
#pragma unroll
        for (int j = 0; j < kARowsPerThread; ++j) {
            const int row = tid / 8 + j * (kThreads / 8);
            const int iy = a_y[j] + ky, ix = a_x[j] + kx;
            const bool ok = iy >= 0 && iy < H_IN && ix >= 0 && ix < W_IN;
            const unsigned short* src = ok ? x + static_cast<long long>(a_base[j] + iy * W_IN + ix) * CIN + c0 : x;
            cp_async16(swizzled(st, row, piece), src, ok ? 16 : 0);
        }
        const int k = chunk * kBK + piece * 8;
#pragma unroll
        for (int j = 0; j < kBRowsPerThread; ++j) {
            const int row = tid / 8 + j * (kThreads / 8);
            cp_async16(swizzled(st + kABytes, row, piece), w + static_cast<long long>(n0 + row) * (9 * CIN) + k, 16);
        }
    };

#pragma unroll
    for (int s = 0; s < CONV_STAGES - 1; ++s) {
        if (s < kChunks) load_chunk(s);
        cp_async_commit();
    }

    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
    const int wg = tid / 128;

    for (int chunk = 0; chunk < kChunks; ++chunk) {
        cp_async_wait<CONV_STAGES - 2>();
        fence_async_shared();
        __syncthreads();  // the chunk's stage is complete for every thread
        const unsigned st = smem + (chunk % CONV_STAGES) * kStageBytes;
        const unsigned long long da = smem_desc(st + wg * 64 * 128);
        const unsigned long long db = smem_desc(st + kABytes);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {  // 16 channels = 32 bytes = 2 in the descriptor's units
            wgmma_tile(acc, da + 2 * kk, db + 2 * kk, chunk > 0 || kk > 0);
        }
        wgmma_commit();
        wgmma_wait<1>();  // the previous chunk's products are done: its stage may be refilled
        __syncthreads();
        const int next = chunk + CONV_STAGES - 1;
        if (next < kChunks) load_chunk(next);
        cp_async_commit();
    }
    wgmma_wait<0>();
    cp_async_wait<0>();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) asm volatile("" : "+f"(acc[i])::"memory");

    // Accumulator layout of m64nN: warp v of the warpgroup holds rows 16 v + lane / 4 (+ 8); register
    // 4 j + e holds column 8 j + 2 (lane % 4) + (e % 2), row + 8 for e >= 2.
    const int lane = tid % 32, warp = (tid % 128) / 32;
    const int row0 = wg * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int half_row = 0; half_row < 2; ++half_row) {
        const int m = m0 + row0 + 8 * half_row;
        if (m >= m_total) continue;
        unsigned short* out = y + static_cast<long long>(m) * COUT + n0;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            const int c = 8 * j + 2 * (lane % 4);
            const float v0 = fmaxf(acc[4 * j + 2 * half_row] + half_to_float(bias[n0 + c]), 0.0f);
            const float v1 = fmaxf(acc[4 * j + 2 * half_row + 1] + half_to_float(bias[n0 + c + 1]), 0.0f);
            *reinterpret_cast<unsigned*>(out + c) = pack_half2(v0, v1);
        }
    }
}
