// The kernel of scripts/probe_sparse_conv.py, not the engine's (docs/PERF_NOTES.md says why).
//
// A 3 x 3 conv (padding 1) + bias + ReLU, float16 NHWC with CHANNELS in and out, that computes only the
// outputs a frame's pillars reach: the backbone's first convs, whose input is mostly empty canvas.
//
// Away from the pillars a conv's input is one constant vector (zero for the canvas, the previous
// layer's background after it), so its output there is one constant vector too, `background` (the
// host works it out once from the weights). Each warp owns a tile of TILE_ROWS x 8 output cells and first
// decides whether any cell of it is "live": its 3 x 3 window holds a live input cell, or (after the
// canvas) reaches the zero padding at the frame's edge. A tile with no live cell is written with the
// background; a live tile is computed with mma.sync (m16n8k16, float32 accumulation), each 2 x 8 of
// its cells one MMA tile's rows and the 9 taps x CHANNELS inputs its K. Every cell's live flag is written to
// `out_live` for the next layer. The canvas has no flags: a canvas cell is live when any of its
// channels is non-zero (a cell of zeros gives what an empty one does, so the test is exact).
//
// K order: lane q of a row's four lanes loads the row's 32-bit words 8q .. 8q + 7; k-step m takes
// words 8q + 2m and 8q + 2m + 1 as the fragment's two k pairs. The filter rows are read the same way,
// so each product pairs the same channel of input and filter.
//
// The filter (KRSC, CHANNELS x 9 x CHANNELS float16) stays in shared memory for the whole grid-stride
// loop over tiles; its rows are padded 16 bytes so the eight rows one 128-bit load phase reads fall in
// distinct banks. A live tile's input window is staged in the warp's own shared slice with cp.async
// (all of it in flight at once, then one wait), its cells padded 16 bytes for the same reason; the
// canvas's live flags are read from that staged window.
//
// Compile-time configuration (-D options from probe_sparse_conv.py): CHANNELS (64), STRIDE (1 or 2), IN_H,
// IN_W, OUT_H, OUT_W, FROM_CANVAS (1: the input is the canvas; 0: the input's live flags are read),
// WARPS (a block's warps), TILE_ROWS (a warp's rows of 8 output cells: 2 or 4).
#include "mma_sync.cuh"

namespace {
constexpr int kTileRows = TILE_ROWS;  // 2 per MMA tile of 16 rows
constexpr int kMmaTiles = kTileRows / 2;
constexpr int kTileCols = 8;
constexpr int kTaps = 9;
constexpr int kCellPieces = CHANNELS / 8;        // 16-byte pieces of one cell
constexpr int kFilterHalves = kTaps * CHANNELS;  // one output channel's filter (K)
constexpr int kFilterRowHalves = kFilterHalves + 8;
constexpr int kCellHalves = CHANNELS + 8;        // a staged input cell
constexpr int kWinRows = (kTileRows - 1) * STRIDE + 3;
constexpr int kWinCols = (kTileCols - 1) * STRIDE + 3;
constexpr int kWinCells = kWinRows * kWinCols;
constexpr int kTilesY = (OUT_H + kTileRows - 1) / kTileRows;
constexpr int kTilesX = (OUT_W + kTileCols - 1) / kTileCols;
static_assert(CHANNELS == 64, "a lane loads a quarter of a 64-channel cell");
static_assert(kTileRows % 2 == 0 && kTileRows * 8 <= 32, "whole MMA tiles, a lane a cell at most");
static_assert(kFilterRowHalves * 2 % 128 == 16 && kCellHalves * 2 % 128 == 16, "rows 16 bytes off the bank period");

__device__ __forceinline__ bool inside(int y, int x) { return y >= 0 && y < IN_H && x >= 0 && x < IN_W; }

// The warp's input window from (wy0, wx0) into its shared slice, zeros outside the frame; visible to
// the whole warp on return.
__device__ __forceinline__ void stage_window(unsigned short* window, const unsigned short* frame_in, int wy0, int wx0,
                                             int lane) {
    for (int i = lane; i < kWinCells * kCellPieces; i += 32) {
        const int cell = i / kCellPieces, piece = i % kCellPieces;
        const int iy = wy0 + cell / kWinCols, ix = wx0 + cell % kWinCols;
        const bool in_frame = inside(iy, ix);
        cp_async16(window + cell * kCellHalves + piece * 8,
                   in_frame ? frame_in + (iy * IN_W + ix) * CHANNELS + piece * 8 : frame_in, in_frame ? 16 : 0);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncwarp();
}
}  // namespace

// Dynamic shared memory: the filter (CHANNELS x kFilterRowHalves), then each warp's window
// (kWinCells x kCellHalves).
extern "C" __global__ void __launch_bounds__(WARPS * 32)
sparse_conv(const unsigned short* __restrict__ in, const unsigned char* __restrict__ in_live,
            const unsigned short* __restrict__ filter, const float* __restrict__ bias,
            const uint4* __restrict__ background, int batch, unsigned short* __restrict__ out,
            unsigned char* __restrict__ out_live) {
    extern __shared__ __align__(16) unsigned short s_shared[];
    __shared__ unsigned char s_flags[WARPS][kWinCells];
    unsigned short* s_filter = s_shared;
    for (int i = threadIdx.x; i < CHANNELS * kFilterHalves / 8; i += blockDim.x) {
        const int row = i / (kFilterHalves / 8);
        const int piece = i - row * (kFilterHalves / 8);
        cp_async16(s_filter + row * kFilterRowHalves + piece * 8, filter + i * 8, 16);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, q = lane % 4;  // the MMA fragments' row group and k pair
    unsigned short* window = s_shared + CHANNELS * kFilterRowHalves + warp * kWinCells * kCellHalves;
    unsigned char* flags = s_flags[warp];
    const long long tiles = static_cast<long long>(batch) * kTilesY * kTilesX;
    for (long long tile = static_cast<long long>(blockIdx.x) * WARPS + warp; tile < tiles;
         tile += static_cast<long long>(gridDim.x) * WARPS) {
        const int frame = static_cast<int>(tile / (kTilesY * kTilesX));
        const int rest = static_cast<int>(tile - static_cast<long long>(frame) * kTilesY * kTilesX);
        const int oy0 = rest / kTilesX * kTileRows, ox0 = rest % kTilesX * kTileCols;
        const int wy0 = oy0 * STRIDE - 1, wx0 = ox0 * STRIDE - 1;  // the window's first input cell
        const unsigned short* frame_in = in + static_cast<long long>(frame) * IN_H * IN_W * CHANNELS;
        __syncwarp();  // the previous tile's window and flags are no longer read

        // 1. The live flags of the tile's input window (0 outside the frame); the canvas's window is
        //    staged first and its flags read from it.
#if FROM_CANVAS
        stage_window(window, frame_in, wy0, wx0, lane);
        for (int cell = lane; cell < kWinCells; cell += 32) {
            unsigned bits = 0u;
#pragma unroll
            for (int piece = 0; piece < kCellPieces; ++piece) {
                const uint4 v = reinterpret_cast<const uint4*>(window + cell * kCellHalves)[piece];
                bits |= v.x | v.y | v.z | v.w;
            }
            flags[cell] = bits != 0u;
        }
#else
        const unsigned char* frame_live = in_live + static_cast<long long>(frame) * IN_H * IN_W;
        for (int cell = lane; cell < kWinCells; cell += 32) {
            const int iy = wy0 + cell / kWinCols, ix = wx0 + cell % kWinCols;
            flags[cell] = inside(iy, ix) ? frame_live[iy * IN_W + ix] : 0;
        }
#endif
        __syncwarp();

        // 2. Each cell's own flag (lane `cell`), then the tile's.
        bool live = false;
        if (lane < kTileRows * kTileCols) {
            const int r = lane / kTileCols, c = lane % kTileCols;
            const int oy = oy0 + r, ox = ox0 + c;
            if (oy < OUT_H && ox < OUT_W) {
#if !FROM_CANVAS  // (the canvas's zero padding is what an empty canvas cell holds)
                live = !inside(oy * STRIDE - 1, ox * STRIDE - 1) || !inside(oy * STRIDE + 1, ox * STRIDE + 1);
#endif
#pragma unroll
                for (int dy = 0; dy < 3; ++dy)
#pragma unroll
                    for (int dx = 0; dx < 3; ++dx) live |= flags[(r * STRIDE + dy) * kWinCols + c * STRIDE + dx] != 0;
                out_live[(static_cast<long long>(frame) * OUT_H + oy) * OUT_W + ox] = live;
            }
        }
        unsigned short* frame_out = out + static_cast<long long>(frame) * OUT_H * OUT_W * CHANNELS;
        if (!__any_sync(0xffffffffu, live)) {  // 3a. the background, 16 cells x kCellPieces pieces
            for (int i = lane; i < kTileRows * kTileCols * kCellPieces; i += 32) {
                const int cell = i / kCellPieces, piece = i % kCellPieces;
                const int oy = oy0 + cell / kTileCols, ox = ox0 + cell % kTileCols;
                if (oy < OUT_H && ox < OUT_W)
                    reinterpret_cast<uint4*>(frame_out + (oy * OUT_W + ox) * CHANNELS)[piece] = background[piece];
            }
            continue;
        }
#if !FROM_CANVAS
        stage_window(window, frame_in, wy0, wx0, lane);  // the live tile's window
#endif

        // 3b. The tile's outputs, CHANNELS a cell: MMA tile t's rows g and g + 8 are column g of tile rows
        //     2t and 2t + 1; the filter's fragments serve every MMA tile.
        float acc[kMmaTiles][CHANNELS / 8][4];
#pragma unroll
        for (int t = 0; t < kMmaTiles; ++t)
#pragma unroll
            for (int nt = 0; nt < CHANNELS / 8; ++nt) acc[t][nt][0] = acc[t][nt][1] = acc[t][nt][2] = acc[t][nt][3] = 0.0f;
#pragma unroll 1
        for (int tap = 0; tap < kTaps; ++tap) {
            const int dy = tap / 3, dx = tap % 3;
            unsigned a[kTileRows][8];  // [tile row][word 8q + j]
#pragma unroll
            for (int r = 0; r < kTileRows; ++r) {
                const uint4* src = reinterpret_cast<const uint4*>(
                    window + ((r * STRIDE + dy) * kWinCols + g * STRIDE + dx) * kCellHalves + q * 16);
                const uint4 lo = src[0], hi = src[1];
                a[r][0] = lo.x; a[r][1] = lo.y; a[r][2] = lo.z; a[r][3] = lo.w;
                a[r][4] = hi.x; a[r][5] = hi.y; a[r][6] = hi.z; a[r][7] = hi.w;
            }
#pragma unroll
            for (int nt = 0; nt < CHANNELS / 8; ++nt) {
                const uint4* w = reinterpret_cast<const uint4*>(
                    s_filter + (nt * 8 + g) * kFilterRowHalves + tap * CHANNELS + q * 16);
                const uint4 w0 = w[0], w1 = w[1];
                const unsigned b[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
                for (int t = 0; t < kMmaTiles; ++t)
#pragma unroll
                    for (int m = 0; m < 4; ++m) {
                        const unsigned frag[4] = {a[2 * t][2 * m], a[2 * t + 1][2 * m], a[2 * t][2 * m + 1],
                                                  a[2 * t + 1][2 * m + 1]};
                        mma16816(acc[t][nt], frag, b[2 * m], b[2 * m + 1]);
                    }
            }
        }
        const int ox = ox0 + g;
        if (ox >= OUT_W) continue;
#pragma unroll
        for (int nt = 0; nt < CHANNELS / 8; ++nt) {
            const int n = nt * 8 + 2 * q;
            const float b0 = bias[n], b1 = bias[n + 1];
#pragma unroll
            for (int r = 0; r < kTileRows; ++r) {
                if (oy0 + r >= OUT_H) continue;
                unsigned* dst = reinterpret_cast<unsigned*>(frame_out + ((oy0 + r) * OUT_W + ox) * CHANNELS + n);
                *dst = pack_relu(acc[r / 2][nt][r % 2 * 2] + b0, acc[r / 2][nt][r % 2 * 2 + 1] + b1);
            }
        }
    }
}
