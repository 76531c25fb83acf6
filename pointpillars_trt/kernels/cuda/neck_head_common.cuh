// The neck-and-heads kernels' shared parts (neck_head.cu, neck_head_wgmma.cu): which head-map pixel a
// block's tile row is, where it reads each branch's input, the float16 kernels' input chunks and u
// fragments, the NHWC store of the head sums.
// Needs neck_head.cu's defines (HY, HX, CELL, NH, NHP, HEAD_BIAS, CU_MAX, B{i}_*, NH_IN_NCHW, USE_MMA,
// USE_TF32), mma_sync.cuh before it, and no header of the CUDA toolkit.
namespace {
constexpr int kCellsY = (HY + CELL - 1) / CELL;
constexpr int kCellsX = (HX + CELL - 1) / CELL;

#define BRANCH(i) B##i##_CIN, B##i##_KP, B##i##_CU, B##i##_STRIDE, B##i##_W, B##i##_BIAS, B##i##_HEAD

// Per branch and tile row, the input pixel index (-1 past the batch or the map), in shared memory:
// registers are the scarce resource of the kernels.
template <int ROWS>
struct RowPixels {
    int pix[3][ROWS];
};

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

// Row p's pixel in branch i's input map (-1 past the batch or the map): NHWC its index (its channels
// start at CIN times it), NCHW the offset of its channel 0 (channel k is k planes further).
template <int CIN, int KP, int CU, int K, int WOFF, int BOFF, int HOFF>
__device__ __forceinline__ int input_pixel(const Pixel& p) {
    constexpr int kH = HY / K, kW = HX / K;
    if (p.n < 0) return -1;
#if NH_IN_NCHW
    return (p.n * CIN * kH + p.y / K) * kW + p.x / K;
#else
    return (p.n * kH + p.y / K) * kW + p.x / K;
#endif
}

// Zero a thread's accumulator tile, unrolled so that it stays in registers.
template <int N, int M>
__device__ __forceinline__ void zero(float (&tile)[N][M]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < M; ++j) tile[i][j] = 0.0f;
}

// pix[i][r]: the input pixel of tile row first_row + r in branch i's map, for the block's ROWS rows.
template <int ROWS>
__device__ __forceinline__ void gather_rows(int (&pix)[3][ROWS], int first_row, int a, int b, int batch) {
    for (int r = threadIdx.x; r < ROWS; r += blockDim.x) {
        const Pixel p = tile_pixel(first_row + r, a, b, batch);
        pix[0][r] = input_pixel<BRANCH(0)>(p);
#if NB > 1
        pix[1][r] = input_pixel<BRANCH(1)>(p);
#endif
#if NB > 2
        pix[2][r] = input_pixel<BRANCH(2)>(p);
#endif
    }
}

#if USE_MMA || USE_TF32
// A warp's head sums (C fragments of the NHP / 8 m16n8 head tiles, rows g and g + 8 of the warp's
// 16 from tile row `row0`) plus the head bias, into the NHWC output: 8 float32 channels per (row,
// head tile) across t, one 32-byte sector. Rows past the batch or the map edge are skipped.
__device__ __forceinline__ void store_heads(const float (&acc_h)[NHP / 8][4], int row0, int a, int b, int batch,
                                            const float* __restrict__ bias, float* __restrict__ out) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int half_row = 0; half_row < 2; ++half_row) {
        const Pixel p = tile_pixel(row0 + g + 8 * half_row, a, b, batch);
        if (p.n < 0) continue;
        float* o = out + ((static_cast<long long>(p.n) * HY + p.y) * HX + p.x) * NH;
#pragma unroll
        for (int h = 0; h < NHP / 8; ++h) {
            const int ch = h * 8 + 2 * t;
            const float v0 = acc_h[h][2 * half_row] + bias[HEAD_BIAS + ch];
            const float v1 = acc_h[h][2 * half_row + 1] + bias[HEAD_BIAS + ch + 1];
            if (NH % 2 == 0) {
                if (ch < NH) *reinterpret_cast<float2*>(o + ch) = make_float2(v0, v1);
            } else {
                if (ch < NH) o[ch] = v0;
                if (ch + 1 < NH) o[ch + 1] = v1;
            }
        }
    }
}
#endif
#if USE_MMA
// The float16 kernels' steps: per branch, its input channels in chunks of kChunk (then, in neck_head_f16,
// its head step).
constexpr int kChunk = 64;  // input channels a step: 128 bytes (the wgmma kernel's swizzled rows)
__host__ __device__ constexpr int chunks_of(int kp) { return (kp + kChunk - 1) / kChunk; }
constexpr int kChunks0 = chunks_of(B0_KP);  // branch i's steps of input channels
#if NB > 1
constexpr int kChunks1 = chunks_of(B1_KP);
#else
constexpr int kChunks1 = 0;
#endif
#if NB > 2
constexpr int kChunks2 = chunks_of(B2_KP);
#else
constexpr int kChunks2 = 0;
#endif

// u = half(relu(deconv + bias)) of upsampled channels 16 j .. 16 j + 15, rows g and g + 8 (t = lane % 4),
// as the A fragment of one m16n8k16 step (and, warp by warp, of wgmma's m64k16): from the deconv's
// accumulators `acc` (flat: registers 8 j .. 8 j + 7 are those channels as the C fragments of two m16n8
// tiles) and the branch's bias at `bias` + BOFF.
template <int BOFF>
__device__ __forceinline__ void u_fragment(const float* acc, const float* __restrict__ bias, int j, int t,
                                           unsigned (&fa)[4]) {
    const int c = j * 16 + 2 * t;
    const float2 b_lo = *reinterpret_cast<const float2*>(bias + BOFF + c);
    const float2 b_hi = *reinterpret_cast<const float2*>(bias + BOFF + c + 8);
    fa[0] = pack_relu(acc[8 * j] + b_lo.x, acc[8 * j + 1] + b_lo.y);
    fa[1] = pack_relu(acc[8 * j + 2] + b_lo.x, acc[8 * j + 3] + b_lo.y);
    fa[2] = pack_relu(acc[8 * j + 4] + b_hi.x, acc[8 * j + 5] + b_hi.y);
    fa[3] = pack_relu(acc[8 * j + 6] + b_hi.x, acc[8 * j + 7] + b_hi.y);
}
#endif
}  // namespace
