// Pillar features -> each frame's dense BEV canvas in the RPN's input layout and precision, so no
// transpose or cast runs before the RPN: (NY, NX, CHANNELS), NHWC, or, with CANVAS_NCHW, (CHANNELS,
// NY, NX) (the IEEE float32 cuDNN backbone's layout, whose kernels are channel-major); float16 with
// CANVAS_HALF, else float32. A batch's frames run in one launch, frame blockIdx.z on its own part of
// each buffer (features, coords, written cells and count, canvas), its pillar count read at
// `counts[z * count_stride]` (the voxelizer's stats rows).
//
// The canvas is zero except at the cells of this frame's pillars. Instead of clearing the whole
// canvas every frame, scatter_clear zeroes only the cells the previous frame wrote (the stage
// remembers them in its own list, since the voxelizer's coords are already overwritten), then
// scatter_write writes this frame's pillars and records their cells. The pillar count is read from
// device memory. NHWC makes both writes coalesced: a pillar's channels are contiguous (NCHW writes
// stride a plane apart: the cells are scattered either way).
//
// Compile-time configuration (-D options from scatter.py): NX, NY, CHANNELS, MAX_PILLARS, CANVAS_HALF,
// CANVAS_NCHW.
#include <cuda_fp16.h>

#include "common.cuh"

namespace {
constexpr long long kCanvasValues = static_cast<long long>(NY) * NX * CHANNELS;  // a frame's canvas
#if CANVAS_HALF
typedef __half canvas_t;
__device__ __forceinline__ canvas_t to_canvas(float v) { return __float2half_rn(v); }
#else
typedef float canvas_t;
__device__ __forceinline__ canvas_t to_canvas(float v) { return v; }
#endif

// Where channel `channel` of BEV cell `cell` (y * NX + x) lives in the canvas.
__device__ __forceinline__ long long canvas_index(int cell, int channel) {
#if CANVAS_NCHW
    return static_cast<long long>(channel) * (static_cast<long long>(NY) * NX) + cell;
#else
    return static_cast<long long>(cell) * CHANNELS + channel;
#endif
}
}  // namespace

// Both kernels stride a grid of a few blocks per SM over the (pillar, channel) slots of the live
// pillars: a grid sized for MAX_PILLARS would be mostly blocks that find nothing to do.

// Zeroes the canvas at each (pillar, channel) the previous frame wrote.
extern "C" __global__ void scatter_clear(const int* __restrict__ written_cells,
                                         const int* __restrict__ written_count,
                                         canvas_t* __restrict__ canvas) {
    written_cells = frame_part(written_cells, MAX_PILLARS);
    written_count = frame_part(written_count, 1);
    canvas = frame_part(canvas, kCanvasValues);
    const long long slots = static_cast<long long>(*written_count) * CHANNELS;
    for (long long t = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; t < slots;
         t += static_cast<long long>(gridDim.x) * blockDim.x) {
        const int pillar = static_cast<int>(t / CHANNELS);
        const int channel = static_cast<int>(t - static_cast<long long>(pillar) * CHANNELS);
        canvas[canvas_index(written_cells[pillar], channel)] = to_canvas(0.0f);
    }
}

// Writes each (pillar, channel): reads of the (P, CHANNELS) features are coalesced (and, NHWC, the
// writes of the cell's channels).
extern "C" __global__ void scatter_write(const float* __restrict__ pillar_features,
                                         const int* __restrict__ coords,
                                         const int* __restrict__ counts, int count_stride,
                                         int* __restrict__ written_cells,
                                         int* __restrict__ written_count,
                                         canvas_t* __restrict__ canvas) {
    pillar_features = frame_part(pillar_features, static_cast<long long>(MAX_PILLARS) * CHANNELS);
    coords = frame_part(coords, 4LL * MAX_PILLARS);
    written_cells = frame_part(written_cells, MAX_PILLARS);
    written_count = frame_part(written_count, 1);
    canvas = frame_part(canvas, kCanvasValues);
    const int live = min(*frame_part(counts, count_stride), MAX_PILLARS);
    const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (first == 0) *written_count = live;
    const long long slots = static_cast<long long>(live) * CHANNELS;
    for (long long t = first; t < slots; t += static_cast<long long>(gridDim.x) * blockDim.x) {
        const int pillar = static_cast<int>(t / CHANNELS);
        const int channel = static_cast<int>(t - static_cast<long long>(pillar) * CHANNELS);
        const int4 c = reinterpret_cast<const int4*>(coords)[pillar];
        const int cell = c.z * NX + c.w;
        canvas[canvas_index(cell, channel)] = to_canvas(pillar_features[t]);
        if (channel == 0) written_cells[pillar] = cell;
    }
}
