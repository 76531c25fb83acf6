// Pillar feature net, fused: decorated pillars (MAX_PILLARS, MAX_PTS, NUM_FEATURES) -> (MAX_PILLARS, OUT_CHANNELS),
// for each frame of a batch in one launch.
//
// The network both families use: one linear map with BatchNorm folded in (weight, bias), ReLU, and the
// max over all MAX_PTS slots (padded slots are zero and take part, as in the references). It runs only
// on the live pillars (the count is read from device memory), so its cost follows the frame, not the
// buffer size an engine with a fixed shape would pay for.
//
// A block stages PILLARS_PER_BLOCK pillars in shared memory (16-byte loads where the rows allow), then
// each thread computes CHANNELS_PER_THREAD channels of one pillar with their weights in registers: a
// feature read from shared memory feeds that many multiply-adds. Each channel's sum runs over the
// features in order, then the bias, then the max over the slots in order, whatever the tiling.
//
// A feature beyond OVERFLOWED_FEATURE (float16's largest value: a point value far outside training,
// such as a corrupt intensity) is counted in the frame's COUNT_OVERFLOWED_FEATURES counter: an atomic
// for each thread that has any, none on a usual frame.
//
// Compile-time configuration (-D options from pfn.py): MAX_PILLARS, MAX_PTS, NUM_FEATURES,
// OUT_CHANNELS, CHANNELS_PER_THREAD (divides OUT_CHANNELS), PILLARS_PER_BLOCK, OVERFLOWED_FEATURE,
// COUNT_OVERFLOWED_FEATURES.
#include "common.cuh"

namespace {
constexpr int kPillarFloats = MAX_PTS * NUM_FEATURES;
// A staged pillar's row in shared memory: whole 16-byte pieces, and not a multiple of 32 floats, so
// the two pillars a warp may read sit in different banks.
constexpr int kRowFloats = (kPillarFloats + 3) / 4 * 4 + ((kPillarFloats + 3) / 4 * 4 % 32 == 0 ? 4 : 0);
constexpr int kGroups = OUT_CHANNELS / CHANNELS_PER_THREAD;  // threads a pillar
constexpr int kThreads = kGroups * PILLARS_PER_BLOCK;
static_assert(OUT_CHANNELS % CHANNELS_PER_THREAD == 0, "channels in whole groups");
}  // namespace

// Block (kGroups, PILLARS_PER_BLOCK): thread (g, y) computes the CHANNELS_PER_THREAD channels from
// g * CHANNELS_PER_THREAD on, of pillar y of each group of pillars; a grid-stride loop over pillar
// groups keeps the grid small when the frame is. Frame blockIdx.z of a batch: its pillars, its
// counters (`counts + z * count_stride`: the voxelizer's stats rows, the pillar count first) and its
// rows of `out`.
extern "C" __global__ void __launch_bounds__(kThreads)
pfn_forward(const float* __restrict__ pillars, const float* __restrict__ weight, const float* __restrict__ bias,
            int* __restrict__ counts, int count_stride, float* __restrict__ out) {
    __shared__ __align__(16) float s_points[PILLARS_PER_BLOCK * kRowFloats];
    const int tid = threadIdx.y * kGroups + threadIdx.x;
    const int first_channel = threadIdx.x * CHANNELS_PER_THREAD;
    float w[CHANNELS_PER_THREAD][NUM_FEATURES];
    float b[CHANNELS_PER_THREAD];
#pragma unroll
    for (int j = 0; j < CHANNELS_PER_THREAD; ++j) {
        b[j] = bias[first_channel + j];
#pragma unroll
        for (int f = 0; f < NUM_FEATURES; ++f) w[j][f] = weight[(first_channel + j) * NUM_FEATURES + f];
    }
    pillars = frame_part(pillars, static_cast<long long>(MAX_PILLARS) * kPillarFloats);
    out = frame_part(out, static_cast<long long>(MAX_PILLARS) * OUT_CHANNELS);
    counts = frame_part(counts, count_stride);
    const int live = min(counts[0], MAX_PILLARS);
    for (int first = blockIdx.x * PILLARS_PER_BLOCK; first < live; first += gridDim.x * PILLARS_PER_BLOCK) {
        __syncthreads();  // the previous group's points are no longer read
        const int rows = min(PILLARS_PER_BLOCK, live - first);
        const float* src = pillars + static_cast<long long>(first) * kPillarFloats;
        if constexpr (kPillarFloats % 4 == 0) {  // rows of whole 16-byte pieces, 16-byte aligned
            constexpr int kPieces = kPillarFloats / 4;
#pragma unroll 4
            for (int i = tid; i < rows * kPieces; i += kThreads) {
                const int y = i / kPieces;
                *reinterpret_cast<float4*>(s_points + y * kRowFloats + (i - y * kPieces) * 4) =
                    __ldg(reinterpret_cast<const float4*>(src) + i);
            }
        } else {
#pragma unroll 4
            for (int i = tid; i < rows * kPillarFloats; i += kThreads) {
                const int y = i / kPillarFloats;
                s_points[y * kRowFloats + (i - y * kPillarFloats)] = __ldg(src + i);
            }
        }
        __syncthreads();
        if (threadIdx.y >= rows) continue;
        const float* x = s_points + threadIdx.y * kRowFloats;
        float best[CHANNELS_PER_THREAD];  // ReLU output is >= 0, so 0 is the identity of the max
#pragma unroll
        for (int j = 0; j < CHANNELS_PER_THREAD; ++j) best[j] = 0.0f;
#pragma unroll 2
        for (int m = 0; m < MAX_PTS; ++m) {
            float v[NUM_FEATURES];
#pragma unroll
            for (int f = 0; f < NUM_FEATURES; ++f) v[f] = x[m * NUM_FEATURES + f];
#pragma unroll
            for (int j = 0; j < CHANNELS_PER_THREAD; ++j) {
                float acc = 0.0f;
#pragma unroll
                for (int f = 0; f < NUM_FEATURES; ++f) acc = fmaf(v[f], w[j][f], acc);
                best[j] = fmaxf(best[j], acc + b[j]);
            }
        }
        int overflowed = 0;
#pragma unroll
        for (int j = 0; j < CHANNELS_PER_THREAD; ++j) overflowed += !(best[j] <= OVERFLOWED_FEATURE);
        if (overflowed) atomicAdd(&counts[COUNT_OVERFLOWED_FEATURES], overflowed);
        float* row = out + static_cast<long long>(first + threadIdx.y) * OUT_CHANNELS + first_channel;
#if CHANNELS_PER_THREAD == 4
        *reinterpret_cast<float4*>(row) = make_float4(best[0], best[1], best[2], best[3]);
#else
#pragma unroll
        for (int j = 0; j < CHANNELS_PER_THREAD; ++j) row[j] = best[j];
#endif
    }
}
