// Deterministic pillar voxelization with fused point decoration.
//
// The result equals the reference's (pointpillars_trt/reference/voxel.py) bit for bit: pillars are
// numbered by their first point, points keep input order inside a pillar, the first MAX_PTS points
// and the first MAX_PILLARS pillars are kept. Atomics only count or pick minima (order-free), or
// place points into per-cell buckets whose order nobody relies on: a point's slot is its rank, the
// number of earlier points of its cell, counted in the bucket. So two runs give identical bytes.
//
// A batch = seven launches on one stream, all sized from capacities (the point capacity is a kernel
// argument, so growing it needs no recompilation); each frame's point count and first row (its
// `frame` header: two int32 on the device, the batch's frames sharing one input buffer) and the
// pillar count are read from device memory, so a CUDA graph can capture the batch. Frame
// blockIdx.z of a launch works on its own part of every per-frame buffer (frame_part): its cells,
// pillars, stats and chunk counters; the point-indexed scratch (point_cell, bucket) is indexed by
// the frame's rows of the shared input, so the frames need no room of their own there. The per-point
// kernels take a frame's points in chunks of one block's threads, their blocks striding over the
// chunks: a grid of a few blocks an SM shared among the batch's frames, not one sized for the
// buffer (which holds a whole batch's points).
//   vox_classify  per point: cell or drop code; atomicMin first point and atomicAdd count per cell
//   vox_count     per point: first-point flags; first points reserve their cell's bucket; chunk sums
//   vox_offsets   one block: pillar numbering offsets per chunk and the frame counters
//   vox_number    per point: pillar ids (first-point order), pillar rows, bucket fill
//   vox_rank      per point: slot = rank in its cell; clears the per-cell scratch for the next frame
//                 (pillars of more than kSmallPillar points are left to vox_rank_large)
//   vox_rank_large block per large pillar: the MAX_PTS smallest point indices by a radix select,
//                 then their ranks among themselves: four passes over the pillar's points instead of
//                 O(points^2) for a pillar holding very many points
//   vox_gather    warp per pillar (grid-stride): decorated features, padded slots zero, stale rows of
//                 the previous frame zeroed
//
// Compile-time configuration (all -D options from voxelize.py, nothing hard-coded here):
//   NX NY NZ, MAX_PILLARS, MAX_PTS, NUM_FEATURES, FEATURE_CODES (4 bits per
//   channel, channel 0 lowest: a single integer, since nvcc splits -D values at commas),
//   RANGE_STRICT (0: inclusive x/y bounds, z by the grid only; 1: strict x/y/z bounds),
//   HAS_TIME (1: each point also has a time lag, read from the `times` array beside the float4 rows;
//   0: `times` is not read),
//   GATHER_WARPS (warps, one pillar each, per vox_gather block),
//   RANGE_MIN_[XYZ], RANGE_MAX_[XYZ], PILLAR_[XYZ], CENTER_OFFSET_[XYZ] (float literals),
//   STAT_* (slots of the stats array), STAT_COUNT (a frame's stats),
//   FEATURE_* (codes of the decoration channels).
#include "common.cuh"

namespace {

constexpr int kOutOfRange = -1;
constexpr int kNonFinite = -2;
constexpr int kNoPoint = 0x7fffffff;
constexpr long long kCells = static_cast<long long>(NX) * NY * NZ;  // a frame's per-cell scratch
constexpr long long kPillarSlots = static_cast<long long>(MAX_PILLARS) * MAX_PTS;

// Per-chunk counters written by vox_count and scanned by vox_offsets.
enum BlockCount { kFirst = 0, kNonFiniteCount = 1, kInRange = 2, kBlockStride = 3 };

// Pillars with more points than this rank their points in vox_rank_large.
constexpr int kSmallPillar = 4 * MAX_PTS > 128 ? 4 * MAX_PTS : 128;

// The frame header (point count, first row) lives on the device; the frame is clamped to the rows
// the input and scratch were sized for.
__device__ __forceinline__ int first_row(const int* frame, int num_rows) {
    return min(max(frame[1], 0), num_rows);
}

__device__ __forceinline__ int live_points(const int* frame, int num_rows) {
    return min(max(frame[0], 0), num_rows - first_row(frame, num_rows));
}

// Chunks of chunk_points points the frame's points fill: the per-point kernels' chunk is their block,
// and vox_count writes one counter row a chunk.
__device__ __forceinline__ int point_chunks(const int* frame, int num_rows, int chunk_points) {
    return (live_points(frame, num_rows) + chunk_points - 1) / chunk_points;
}

// This block's frame's chunk counters: room for a frame of all num_rows points.
template <typename T>
__device__ __forceinline__ T* frame_block_counts(T* block_counts, int num_rows, int chunk_points) {
    return frame_part(block_counts, static_cast<long long>((num_rows + chunk_points - 1) / chunk_points) * kBlockStride);
}

// floor((p - lo) / size) in IEEE float32 (the reference's numerics); -1 outside [0, n).
__device__ __forceinline__ int grid_index(float p, float lo, float size, int n) {
    const float q = floorf(__fdiv_rn(__fsub_rn(p, lo), size));
    return (q >= 0.0f && q < static_cast<float>(n)) ? static_cast<int>(q) : -1;
}

__device__ __forceinline__ int classify(float4 p, float t) {
    if (!(isfinite(p.x) && isfinite(p.y) && isfinite(p.z) && isfinite(p.w) && isfinite(t))) return kNonFinite;
#if RANGE_STRICT
    const bool inside = p.x > RANGE_MIN_X && p.x < RANGE_MAX_X && p.y > RANGE_MIN_Y &&
                        p.y < RANGE_MAX_Y && p.z > RANGE_MIN_Z && p.z < RANGE_MAX_Z;
#else
    const bool inside = p.x >= RANGE_MIN_X && p.x <= RANGE_MAX_X && p.y >= RANGE_MIN_Y &&
                        p.y <= RANGE_MAX_Y;
#endif
    if (!inside) return kOutOfRange;
    const int ix = grid_index(p.x, RANGE_MIN_X, PILLAR_X, NX);
    const int iy = grid_index(p.y, RANGE_MIN_Y, PILLAR_Y, NY);
    const int iz = grid_index(p.z, RANGE_MIN_Z, PILLAR_Z, NZ);
    if (ix < 0 || iy < 0 || iz < 0) return kOutOfRange;
    return (iz * NY + iy) * NX + ix;
}

// A point is the first of its cell when it holds the cell's minimum index.
__device__ __forceinline__ bool is_first(int i, int cell, const int* cell_first) {
    return cell >= 0 && cell_first[cell] == i;
}

}  // namespace

// A point's time lag: 0 (finite, never read as a feature) without HAS_TIME.
__device__ __forceinline__ float time_of(const float* times, int row) {
#if HAS_TIME
    return times[row];
#else
    return 0.0f;
#endif
}

extern "C" __global__ void vox_classify(const float4* __restrict__ points, const float* __restrict__ times,
                                        const int* __restrict__ frame, int num_rows,
                                        int* __restrict__ point_cell, int* __restrict__ cell_first,
                                        int* __restrict__ cell_count) {
    frame = frame_part(frame, 2);
    cell_first = frame_part(cell_first, kCells);
    cell_count = frame_part(cell_count, kCells);
    const int live = live_points(frame, num_rows), first = first_row(frame, num_rows);
    point_cell += first;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < live; i += gridDim.x * blockDim.x) {
        const int row = first + i;
        const int cell = classify(points[row], time_of(times, row));
        point_cell[i] = cell;
        if (cell >= 0) {
            atomicMin(&cell_first[cell], i);
            atomicAdd(&cell_count[cell], 1);
        }
    }
}

extern "C" __global__ void vox_count(const int* __restrict__ frame, int num_rows,
                                     const int* __restrict__ point_cell,
                                     const int* __restrict__ cell_first,
                                     const int* __restrict__ cell_count,
                                     int* __restrict__ cell_bucket, int* __restrict__ stats,
                                     int* __restrict__ block_counts) {
    __shared__ int block_start;
    frame = frame_part(frame, 2);
    point_cell += first_row(frame, num_rows);
    cell_first = frame_part(cell_first, kCells);
    cell_count = frame_part(cell_count, kCells);
    cell_bucket = frame_part(cell_bucket, kCells);
    stats = frame_part(stats, STAT_COUNT);
    block_counts = frame_block_counts(block_counts, num_rows, blockDim.x);
    const int live = live_points(frame, num_rows), chunks = point_chunks(frame, num_rows, blockDim.x);
    for (int chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {  // uniform over the block
        const int i = chunk * blockDim.x + threadIdx.x;
        int first = 0, nonfinite = 0, in_range = 0, cell = kOutOfRange, size = 0;
        if (i < live) {
            cell = point_cell[i];
            nonfinite = cell == kNonFinite;
            in_range = cell >= 0;
            first = is_first(i, cell, cell_first);
            if (first) size = cell_count[cell];
        }
        // Buckets: one atomic per chunk reserves room for the chunk's cells. Where a bucket lies does
        // not matter, only its contents.
        int chunk_size;
        const int offset = pp_block_exclusive_scan(size, &chunk_size);
        if (threadIdx.x == 0) block_start = chunk_size ? atomicAdd(&stats[STAT_CURSOR], chunk_size) : 0;
        __syncthreads();
        if (first) cell_bucket[cell] = block_start + offset;
        const int f = pp_block_sum(first);
        const int n = pp_block_sum(nonfinite);
        const int r = pp_block_sum(in_range);
        if (threadIdx.x == 0) {
            int* row = block_counts + chunk * kBlockStride;
            row[kFirst] = f;
            row[kNonFiniteCount] = n;
            row[kInRange] = r;
        }
    }
}

// chunk_points: the per-point kernels' block size, the chunk vox_count wrote a counter row for.
extern "C" __global__ void vox_offsets(const int* __restrict__ frame, int num_rows, int chunk_points,
                                       int* __restrict__ block_counts, int* __restrict__ stats) {
    __shared__ int totals[kBlockStride];
    frame = frame_part(frame, 2);
    block_counts = frame_block_counts(block_counts, num_rows, chunk_points);
    stats = frame_part(stats, STAT_COUNT);
    const int chunks = point_chunks(frame, num_rows, chunk_points);
    pp_scan_block_counts<kBlockStride>(block_counts, chunks, totals);
    __syncthreads();
    if (threadIdx.x == 0) {
        const int total = totals[kFirst];
        const int kept = min(total, MAX_PILLARS);
        stats[STAT_PREVIOUS_PILLARS] = stats[STAT_PILLARS];
        stats[STAT_PILLARS] = kept;
        stats[STAT_PILLARS_TOTAL] = total;
        stats[STAT_PILLARS_DROPPED] = total - kept;
        stats[STAT_NONFINITE] = totals[kNonFiniteCount];
        stats[STAT_IN_RANGE] = totals[kInRange];
        stats[STAT_OVERFLOWED_FEATURES] = 0;  // pfn_forward counts this frame's from here
        stats[STAT_CURSOR] = 0;  // vox_count of the next frame allocates buckets from zero
        stats[STAT_LARGE_PILLARS] = 0;  // vox_number lists this frame's large pillars from here
    }
}

extern "C" __global__ void vox_number(const int* __restrict__ frame, int num_rows,
                                      const int* __restrict__ point_cell,
                                      const int* __restrict__ cell_first,
                                      const int* __restrict__ cell_count,
                                      const int* __restrict__ cell_bucket,
                                      const int* __restrict__ block_counts,
                                      int* __restrict__ cell_fill, int* __restrict__ cell_pillar,
                                      int* __restrict__ bucket, int* __restrict__ pillar_bucket,
                                      int* __restrict__ pillar_total, int* __restrict__ coords,
                                      int* __restrict__ num_points, int* __restrict__ stats,
                                      int* __restrict__ large_pillars) {
    frame = frame_part(frame, 2);
    point_cell += first_row(frame, num_rows);
    bucket += first_row(frame, num_rows);
    cell_first = frame_part(cell_first, kCells);
    cell_count = frame_part(cell_count, kCells);
    cell_bucket = frame_part(cell_bucket, kCells);
    cell_fill = frame_part(cell_fill, kCells);
    cell_pillar = frame_part(cell_pillar, kCells);
    block_counts = frame_block_counts(block_counts, num_rows, blockDim.x);
    pillar_bucket = frame_part(pillar_bucket, MAX_PILLARS);
    pillar_total = frame_part(pillar_total, MAX_PILLARS);
    coords = frame_part(coords, 4LL * MAX_PILLARS);
    num_points = frame_part(num_points, MAX_PILLARS);
    stats = frame_part(stats, STAT_COUNT);
    large_pillars = frame_part(large_pillars, MAX_PILLARS);
    const int live_count = live_points(frame, num_rows), chunks = point_chunks(frame, num_rows, blockDim.x);
    for (int chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {  // uniform over the block
        const int i = chunk * blockDim.x + threadIdx.x;
        const bool live = i < live_count;
        const int cell = live ? point_cell[i] : kOutOfRange;
        const bool first = live && is_first(i, cell, cell_first);
        int unused;
        const int pillar =
            block_counts[chunk * kBlockStride + kFirst] + pp_block_exclusive_scan(first, &unused);
        if (cell < 0) continue;
        const int start = cell_bucket[cell];
        bucket[start + atomicAdd(&cell_fill[cell], 1)] = i;
        if (!first) continue;
        if (pillar >= MAX_PILLARS) {
            cell_pillar[cell] = -1;
            continue;
        }
        cell_pillar[cell] = pillar;
        const int count = cell_count[cell];
        pillar_bucket[pillar] = start;
        pillar_total[pillar] = count;
        num_points[pillar] = min(count, MAX_PTS);
        if (count > kSmallPillar) large_pillars[atomicAdd(&stats[STAT_LARGE_PILLARS], 1)] = pillar;
        const int ix = cell % NX;
        const int iy = (cell / NX) % NY;
        const int iz = cell / (NX * NY);
        reinterpret_cast<int4*>(coords)[pillar] = make_int4(0, iz, iy, ix);
    }
}

extern "C" __global__ void vox_rank(const int* __restrict__ frame, int num_rows,
                                    const int* __restrict__ point_cell,
                                    const int* __restrict__ cell_pillar,
                                    const int* __restrict__ bucket,
                                    const int* __restrict__ pillar_bucket,
                                    const int* __restrict__ pillar_total,
                                    int* __restrict__ cell_first, int* __restrict__ cell_count,
                                    int* __restrict__ cell_fill, int* __restrict__ slot_point) {
    frame = frame_part(frame, 2);
    point_cell += first_row(frame, num_rows);
    bucket += first_row(frame, num_rows);
    cell_pillar = frame_part(cell_pillar, kCells);
    cell_first = frame_part(cell_first, kCells);
    cell_count = frame_part(cell_count, kCells);
    cell_fill = frame_part(cell_fill, kCells);
    pillar_bucket = frame_part(pillar_bucket, MAX_PILLARS);
    pillar_total = frame_part(pillar_total, MAX_PILLARS);
    slot_point = frame_part(slot_point, kPillarSlots);
    const int live = live_points(frame, num_rows);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < live; i += gridDim.x * blockDim.x) {
        const int cell = point_cell[i];
        if (cell < 0) continue;
        const int pillar = cell_pillar[cell];
        // Every reader of these per-cell values ran in an earlier launch: reset them for the next frame.
        cell_first[cell] = kNoPoint;
        cell_count[cell] = 0;
        cell_fill[cell] = 0;
        if (pillar < 0) continue;
        const int total = pillar_total[pillar];
        if (total > kSmallPillar) continue;  // vox_rank_large's
        const int* members = bucket + pillar_bucket[pillar];
        // No early exit at rank MAX_PTS: a loop bound that waits on each load's result made the members'
        // loads one after another (~0.3 us each from L2); unrolled, they are in flight together.
        int rank = 0;
#pragma unroll 8
        for (int j = 0; j < total; ++j) rank += members[j] < i;
        if (rank < MAX_PTS) slot_point[pillar * MAX_PTS + rank] = i;
    }
}

namespace {

// One warp: the digit d whose count, added to those of the digits below it, first reaches `need`;
// writes the prefix with d in place and the rank still needed among the members with that digit.
// Each lane sums 8 digits, a warp scan finds the lane holding d (a serial walk over 256 shared counts
// by one thread took ~4 us a pass).
__device__ __forceinline__ void select_digit(const int* hist, int need, unsigned prefix, int shift,
                                             unsigned* selected_prefix, int* selected_need) {
    const int lane = threadIdx.x & 31;
    int counts[8];
    int sum = 0;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        counts[q] = hist[lane * 8 + q];
        sum += counts[q];
    }
    int inclusive = sum;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
        const int below = __shfl_up_sync(PP_FULL_MASK, inclusive, offset);
        if (lane >= offset) inclusive += below;
    }
    const int owner = __ffs(__ballot_sync(PP_FULL_MASK, inclusive >= need)) - 1;
    if (lane != owner) return;
    int below = inclusive - sum, digit = lane * 8 + 7;
    bool found = false;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        if (!found && below + counts[q] >= need) {
            digit = lane * 8 + q;
            found = true;
        } else if (!found) {
            below += counts[q];
        }
    }
    *selected_prefix = prefix | (static_cast<unsigned>(digit) << shift);
    *selected_need = need - below;
}

}  // namespace

// Grid-stride over the frame's large pillars, one block each. The kept points are the MAX_PTS
// smallest indices of the pillar: a radix select (four 8-bit digits, a shared histogram per digit)
// finds the MAX_PTS-th smallest index v in four passes over the members; indices are distinct, so
// exactly MAX_PTS members are <= v, and those few are then ranked among themselves.
extern "C" __global__ void vox_rank_large(const int* __restrict__ frame, int num_rows,
                                          const int* __restrict__ stats,
                                          const int* __restrict__ large_pillars,
                                          const int* __restrict__ bucket,
                                          const int* __restrict__ pillar_bucket,
                                          const int* __restrict__ pillar_total,
                                          int* __restrict__ slot_point) {
    __shared__ int hist[256];
    __shared__ int kept[MAX_PTS];
    __shared__ int num_kept;
    __shared__ unsigned selected_prefix;
    __shared__ int selected_need;
    frame = frame_part(frame, 2);
    bucket += first_row(frame, num_rows);
    stats = frame_part(stats, STAT_COUNT);
    large_pillars = frame_part(large_pillars, MAX_PILLARS);
    pillar_bucket = frame_part(pillar_bucket, MAX_PILLARS);
    pillar_total = frame_part(pillar_total, MAX_PILLARS);
    slot_point = frame_part(slot_point, kPillarSlots);
    for (int k = blockIdx.x; k < stats[STAT_LARGE_PILLARS]; k += gridDim.x) {
        const int pillar = large_pillars[k];
        const int* members = bucket + pillar_bucket[pillar];
        const int total = pillar_total[pillar];
        unsigned prefix = 0;  // the digits of v found so far
        int need = MAX_PTS;   // rank of v among the members that share those digits
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int d = threadIdx.x; d < 256; d += blockDim.x) hist[d] = 0;
            __syncthreads();
            const unsigned long long high = static_cast<unsigned long long>(prefix) >> (shift + 8);
            // Most members share a digit in the high passes: one shared atomic per distinct digit per
            // warp, not per member (the loop bound is uniform, so every lane takes part in the match).
            for (int base = 0; base < total; base += blockDim.x) {
                const int j = base + threadIdx.x;
                const unsigned m = j < total ? static_cast<unsigned>(members[j]) : 0u;
                const bool counted = j < total && (static_cast<unsigned long long>(m) >> (shift + 8)) == high;
                const unsigned digit = counted ? (m >> shift) & 255u : 256u;
                const unsigned peers = __match_any_sync(PP_FULL_MASK, digit);
                if (counted && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
            }
            __syncthreads();
            if (threadIdx.x < 32) select_digit(hist, need, prefix, shift, &selected_prefix, &selected_need);
            __syncthreads();
            prefix = selected_prefix;
            need = selected_need;
        }
        if (threadIdx.x == 0) num_kept = 0;
        __syncthreads();
        for (int j = threadIdx.x; j < total; j += blockDim.x)
            if (static_cast<unsigned>(members[j]) <= prefix) kept[atomicAdd(&num_kept, 1)] = members[j];
        __syncthreads();
        for (int s = threadIdx.x; s < MAX_PTS; s += blockDim.x) {
            int rank = 0;
            for (int q = 0; q < MAX_PTS; ++q) rank += kept[q] < kept[s];
            slot_point[pillar * MAX_PTS + rank] = kept[s];
        }
        __syncthreads();
    }
}

namespace {

constexpr int kGatherWarps = GATHER_WARPS;

__device__ __forceinline__ float feature(int channel, float4 p, float t, float3 mean, float3 centre) {
    switch (static_cast<int>((FEATURE_CODES >> (4 * channel)) & 15ull)) {
        case FEATURE_TIME: return t;
        case FEATURE_X: return p.x;
        case FEATURE_Y: return p.y;
        case FEATURE_Z: return p.z;
        case FEATURE_INTENSITY: return p.w;
        case FEATURE_MEAN_DX: return __fsub_rn(p.x, mean.x);
        case FEATURE_MEAN_DY: return __fsub_rn(p.y, mean.y);
        case FEATURE_MEAN_DZ: return __fsub_rn(p.z, mean.z);
        case FEATURE_CENTER_DX: return __fsub_rn(p.x, centre.x);
        case FEATURE_CENTER_DY: return __fsub_rn(p.y, centre.y);
        default: return __fsub_rn(p.z, centre.z);  // FEATURE_CENTER_DZ
    }
}

__device__ __forceinline__ float centre_of(int index, float size, float offset) {
    return __fadd_rn(__fmul_rn(static_cast<float>(index), size), offset);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kGatherWarps * 32)
vox_gather(const float4* __restrict__ points, const float* __restrict__ times, const int* __restrict__ frame,
           int num_rows, const int* __restrict__ slot_point, const int* __restrict__ stats, int* __restrict__ coords,
           int* __restrict__ num_points, float* __restrict__ features) {
    __shared__ float4 staged[kGatherWarps][MAX_PTS];
#if HAS_TIME
    __shared__ float staged_time[kGatherWarps][MAX_PTS];
#endif
    frame = frame_part(frame, 2);
    slot_point = frame_part(slot_point, kPillarSlots);
    stats = frame_part(stats, STAT_COUNT);
    coords = frame_part(coords, 4LL * MAX_PILLARS);
    num_points = frame_part(num_points, MAX_PILLARS);
    features = frame_part(features, kPillarSlots * NUM_FEATURES);
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int live = stats[STAT_PILLARS];
    const int end = min(MAX_PILLARS, max(live, stats[STAT_PREVIOUS_PILLARS]));
    const int first = first_row(frame, num_rows);
    // Grid-stride over the pillars this frame or the previous one wrote: the grid is sized for the GPU,
    // not for MAX_PILLARS (most of whose warps would find nothing to do).
    for (int pillar = blockIdx.x * kGatherWarps + warp; pillar < end; pillar += gridDim.x * kGatherWarps) {
        __syncwarp();  // the previous pillar's staged points are read by every lane
        float* row = features + static_cast<size_t>(pillar) * (MAX_PTS * NUM_FEATURES);
        if (pillar >= live) {  // written by the previous frame, not by this one: back to zero
            for (int e = lane; e < MAX_PTS * NUM_FEATURES; e += 32) row[e] = 0.0f;
            if (lane == 0) {
                reinterpret_cast<int4*>(coords)[pillar] = make_int4(0, 0, 0, 0);
                num_points[pillar] = 0;
            }
            continue;
        }
        const int n = num_points[pillar];
        for (int s = lane; s < MAX_PTS; s += 32) {
            const int src = s < n ? first + slot_point[pillar * MAX_PTS + s] : -1;
            staged[warp][s] = src >= 0 ? points[src] : make_float4(0, 0, 0, 0);
#if HAS_TIME
            staged_time[warp][s] = src >= 0 ? times[src] : 0.0f;
#endif
        }
        __syncwarp();
        // Sequential float32 sum in slot order: the reference's order, hence its exact bits.
        float3 sum = make_float3(0.0f, 0.0f, 0.0f);
        for (int s = 0; s < n; ++s) {
            sum.x = __fadd_rn(sum.x, staged[warp][s].x);
            sum.y = __fadd_rn(sum.y, staged[warp][s].y);
            sum.z = __fadd_rn(sum.z, staged[warp][s].z);
        }
        const float count = static_cast<float>(n);
        const float3 mean =
            make_float3(__fdiv_rn(sum.x, count), __fdiv_rn(sum.y, count), __fdiv_rn(sum.z, count));
        const int4 c = reinterpret_cast<const int4*>(coords)[pillar];
        const float3 centre = make_float3(centre_of(c.w, PILLAR_X, CENTER_OFFSET_X),
                                          centre_of(c.z, PILLAR_Y, CENTER_OFFSET_Y),
                                          centre_of(c.y, PILLAR_Z, CENTER_OFFSET_Z));
        for (int e = lane; e < MAX_PTS * NUM_FEATURES; e += 32) {
            const int s = e / NUM_FEATURES;
            const int ch = e - s * NUM_FEATURES;
#if HAS_TIME
            const float t = staged_time[warp][s];
#else
            const float t = 0.0f;
#endif
            row[e] = s < n ? feature(ch, staged[warp][s], t, mean, centre) : 0.0f;
        }
    }
}
