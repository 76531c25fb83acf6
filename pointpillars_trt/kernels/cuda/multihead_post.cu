// Multi-head post-process (OpenPCDet's AnchorHeadMulti + MULTI_CLASSES_NMS): head maps -> boxes
// with velocities, one small output. Same result as pointpillars_trt/reference/multihead.py.
//
// A segment is one class: its head's anchors scored for that class alone, thresholded, the top
// TOP_K by (score desc, row asc), decoded (sin/cos heading, velocity), rotated BEV NMS, the first
// max_boxes kept. Segments are written in class order (heads in order, classes in head order),
// each in NMS order, as OpenPCDet concatenates them. Row r of a head is anchor a = r / plane of its
// cell grid (a = class-in-head * rotations + rotation), pixel r % plane; the head's class logits
// and box codes sit at channel offsets of the merged NHWC map (segment table, below).
// A batch's frames run in one set of launches, frame blockIdx.z on its own part of every per-frame
// buffer (frame_part); the segment table, anchors and thresholds are the batch's. Launch order, one
// stream (the blocks below are a frame's):
//   mh_score      per (row, segment): score key (0: fails the threshold), candidate lists, overflows
//   mh_select     block per segment: top TOP_K (radix select + bitonic sort), decoded members
//   mh_nms_mask   IoU bit matrix of each segment (rotated_nms.cuh)
//   mh_reduce     one block: greedy NMS per segment, output rows and header; resets the counts
//
// Compile-time configuration (-D options from multihead_post.py): HEAD_W, HEAD_H, HEAD_CHANNELS,
// NUM_SEGMENTS, MAX_ROWS (rows of the largest head), CODE_SIZE, SINCOS (1: heading from a (cos,
// sin) pair), VELOCITY (1: two velocity values follow the angle), SCORE_INCLUSIVE, TOP_K,
// SORT_CAP, MAX_BOXES (per segment; the run-time value is at most this), NMS_MARGIN,
// STYLE_OPENPCDET, NMS_RECT_FLOATS, NMS_MASK_THREADS, ROW_FLOATS, SCORE_BLOCK, HEADER_EXTRA, SEG_* (columns of the
// segment table), SEG_INTS, OVERFLOWED_LOGIT, STAT_* / HEADER_* / THRESHOLD_* slots.
#include "common.cuh"
#include "result_header.cuh"
#include "rotated_nms.cuh"
#include "score_keys.cuh"

namespace {

constexpr int kPlane = HEAD_W * HEAD_H;
constexpr long long kHeadValues = static_cast<long long>(kPlane) * HEAD_CHANNELS;  // a frame's head map
constexpr long long kSlots = static_cast<long long>(NUM_SEGMENTS) * SORT_CAP;       // a frame's NMS members
constexpr long long kStats = NUM_SEGMENTS * static_cast<long long>(STAT_COUNT);        // a frame's stats

// Offset of the first channel of row r's pixel in the merged NHWC map.
__device__ __forceinline__ size_t cell_of(int r) {
    return static_cast<size_t>(r % kPlane) * HEAD_CHANNELS;
}

}  // namespace

// Key of row r: the score's bits + 1 when it passes the threshold (keys then order like scores),
// 0 when it does not. A passing row also takes a place in its segment's candidate list (in no set
// order: mh_select sorts it), while there are no more than SORT_CAP; an overflowed logit
// (``overflowed``) is counted. Grid (row blocks, segments).
extern "C" __global__ void __launch_bounds__(SCORE_BLOCK)
mh_score(const float* __restrict__ heads, const int* __restrict__ segments, const float* __restrict__ thresholds,
         unsigned* __restrict__ key, unsigned long long* __restrict__ candidates, int* __restrict__ stats) {
    heads = frame_part(heads, kHeadValues);
    key = frame_part(key, static_cast<long long>(NUM_SEGMENTS) * MAX_ROWS);
    candidates = frame_part(candidates, kSlots);
    stats = frame_part(stats, kStats);
    const int s = blockIdx.y;
    const int* seg = segments + s * SEG_INTS;
    const int rows = seg[SEG_ANCHORS] * kPlane;
    int* counts = stats + s * STAT_COUNT;
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    int over = 0;
    if (r < rows) {
        const int a = r / kPlane;
        const float logit = heads[cell_of(r) + seg[SEG_CLS_AT] + a * seg[SEG_CLASSES] + seg[SEG_CLASS]];
        const float p = sigmoid(logit);
        const bool pass = passes(p, thresholds[THRESHOLD_SCORE]);
        over = overflowed(logit);
        key[static_cast<size_t>(s) * MAX_ROWS + r] = pass ? __float_as_uint(p) + 1u : 0u;
        if (pass) {
            const int place = atomicAdd(&counts[STAT_CANDIDATES], 1);
            if (place < SORT_CAP) candidates[s * SORT_CAP + place] = score_key(p, static_cast<unsigned>(r));
        }
    }
    add_warp_count(&counts[STAT_OVERFLOWED_SCORES], over);
}

// Top TOP_K rows of segment blockIdx.x by (score desc, row asc), decoded into its NMS group: the
// candidate list sorted, or, when more than TOP_K pass, select_top_keys over the rows' keys.
extern "C" __global__ void __launch_bounds__(1024)
mh_select(const float* __restrict__ heads, const float* __restrict__ anchors, const int* __restrict__ segments,
          const unsigned* __restrict__ key, const unsigned long long* __restrict__ candidates,
          int* __restrict__ stats, int* __restrict__ group_count,
          float* __restrict__ group_box, float* __restrict__ group_velocity, float* __restrict__ group_rect,
          float* __restrict__ group_score) {
    __shared__ unsigned long long keys[SORT_CAP];
    heads = frame_part(heads, kHeadValues);
    key = frame_part(key, static_cast<long long>(NUM_SEGMENTS) * MAX_ROWS);
    candidates = frame_part(candidates, kSlots);
    stats = frame_part(stats, kStats);
    group_count = frame_part(group_count, NUM_SEGMENTS);
    group_box = frame_part(group_box, kSlots * 7);
    group_velocity = frame_part(group_velocity, kSlots * 2);
    group_rect = frame_part(group_rect, kSlots * kRectFloats);
    group_score = frame_part(group_score, kSlots);
    const int s = blockIdx.x;
    const int* seg = segments + s * SEG_INTS;
    const int rows = seg[SEG_ANCHORS] * kPlane;
    const unsigned* mine = key + static_cast<size_t>(s) * MAX_ROWS;
    const int n = stats[s * STAT_COUNT + STAT_CANDIDATES];
    const int k = min(n, TOP_K);
    if (n <= TOP_K) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) keys[i] = candidates[s * SORT_CAP + i];
    } else {  // the rows' keys: 0 (failing) never ranks among the TOP_K of more than TOP_K passing
        select_top_keys(mine, rows, TOP_K, keys, [](int i, unsigned u) {
            return score_key(__uint_as_float(u - 1u), static_cast<unsigned>(i));
        });
    }
    const int sorted = pow2_at_least(k);
    for (int i = k + threadIdx.x; i < sorted; i += blockDim.x) keys[i] = 0ull;
    pp_bitonic_sort_desc(keys, sorted);
    const float* first_anchor = anchors + static_cast<size_t>(seg[SEG_FIRST_ANCHOR]) * 7;
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        const int r = static_cast<int>(key_index(keys[j]));
        const float* t = heads + cell_of(r) + seg[SEG_BOX_AT] + (r / kPlane) * CODE_SIZE;
        const float* an = first_anchor + static_cast<size_t>(r) * 7;
        float b[7];
        const float diag = __fsqrt_rn(__fadd_rn(__fmul_rn(an[3], an[3]), __fmul_rn(an[4], an[4])));
        b[0] = __fadd_rn(__fmul_rn(t[0], diag), an[0]);
        b[1] = __fadd_rn(__fmul_rn(t[1], diag), an[1]);
        b[2] = __fadd_rn(__fmul_rn(t[2], an[5]), an[2]);
#pragma unroll
        for (int q = 3; q < 6; ++q) b[q] = __fmul_rn(expf(t[q]), an[q]);
#if SINCOS
        b[6] = atan2f(__fadd_rn(t[7], sinf(an[6])), __fadd_rn(t[6], cosf(an[6])));
        constexpr int kRest = 8;
#else
        b[6] = __fadd_rn(t[6], an[6]);
        constexpr int kRest = 7;
#endif
        const int slot = s * SORT_CAP + j;
#pragma unroll
        for (int q = 0; q < 7; ++q) group_box[slot * 7 + q] = b[q];
#if VELOCITY
        group_velocity[slot * 2] = __fadd_rn(t[kRest], 0.0f);  // the anchors' zero velocity, as OpenPCDet adds it
        group_velocity[slot * 2 + 1] = __fadd_rn(t[kRest + 1], 0.0f);
#endif
        store_rect(group_rect + slot * kRectFloats, nms_rect(b));
        group_score[slot] = key_score(keys[j]);
    }
    if (threadIdx.x == 0) {
        group_count[s] = k;
        stats[s * STAT_COUNT + STAT_SELECTED] = k;
    }
}

extern "C" __global__ void __launch_bounds__(NMS_MASK_THREADS)
mh_nms_mask(const int* __restrict__ group_count, const float* __restrict__ group_rect,
            const float* __restrict__ thresholds, unsigned long long* __restrict__ mask) {
    nms_mask_words(frame_part(group_count, NUM_SEGMENTS), frame_part(group_rect, kSlots * kRectFloats),
                   thresholds[THRESHOLD_NMS_IOU], frame_part(mask, kSlots * kNmsColBlocks));
}

// Greedy NMS per segment (the first max_boxes kept of each), then the rows in segment order:
// x, y, z, dx, dy, dz, heading, score, label (the segment: the class index) [, vx, vy]. Row 0 is
// the header: count, candidates, selected, overflowed scores (summed over the segments), then `extra`
// (the voxelizer's counts, extra_stride apart a frame). The candidate and overflow counts are zeroed
// for the next frame's mh_score.
extern "C" __global__ void __launch_bounds__(256)
mh_reduce(const int* __restrict__ group_count, const unsigned long long* __restrict__ mask,
          const float* __restrict__ group_box, const float* __restrict__ group_velocity,
          const float* __restrict__ group_score, int* __restrict__ stats, const int* __restrict__ extra,
          int extra_stride, int num_extra, const float* __restrict__ thresholds, int* __restrict__ kept,
          float* __restrict__ out) {
    group_count = frame_part(group_count, NUM_SEGMENTS);
    mask = frame_part(mask, kSlots * kNmsColBlocks);
    group_box = frame_part(group_box, kSlots * 7);
    group_velocity = frame_part(group_velocity, kSlots * 2);
    group_score = frame_part(group_score, kSlots);
    stats = frame_part(stats, kStats);
    extra = frame_part(extra, extra_stride);
    kept = frame_part(kept, kSlots);
    out = frame_part(out, (1LL + static_cast<long long>(MAX_BOXES) * NUM_SEGMENTS) * ROW_FLOATS);
    const int max_boxes = max(1, min(MAX_BOXES, static_cast<int>(thresholds[THRESHOLD_MAX_BOXES])));
    int total = 0;
    for (int s = 0; s < NUM_SEGMENTS; ++s) total += greedy_nms_group(mask, s, group_count[s], max_boxes, kept + total);
    __syncthreads();  // kept[] is complete
    for (int r = threadIdx.x; r < total; r += blockDim.x) {
        const int slot = kept[r];
        float* row = out + static_cast<size_t>(1 + r) * ROW_FLOATS;
#pragma unroll
        for (int q = 0; q < 7; ++q) row[q] = group_box[slot * 7 + q];
        row[7] = group_score[slot];
        row[8] = static_cast<float>(slot / SORT_CAP);
#if VELOCITY
        row[9] = group_velocity[slot * 2];
        row[10] = group_velocity[slot * 2 + 1];
#endif
    }
    __shared__ int sums[STAT_COUNT];
    if (threadIdx.x < STAT_COUNT) {
        int sum = 0;
        for (int s = 0; s < NUM_SEGMENTS; ++s) sum += stats[s * STAT_COUNT + threadIdx.x];
        sums[threadIdx.x] = sum;
    }
    __syncthreads();  // the sums read every segment's counts
    write_result_header(out, ROW_FLOATS, total, sums[STAT_CANDIDATES], sums[STAT_SELECTED], sums[STAT_OVERFLOWED_SCORES],
                        extra, num_extra);
    for (int s = threadIdx.x; s < NUM_SEGMENTS; s += blockDim.x) {
        stats[s * STAT_COUNT + STAT_CANDIDATES] = 0;
        stats[s * STAT_COUNT + STAT_OVERFLOWED_SCORES] = 0;
    }
}
