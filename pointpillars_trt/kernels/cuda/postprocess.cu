// Head maps -> final boxes: score, threshold, top-k, decode, rotated BEV NMS, one small output a frame.
// A frame's head map is its merged NHWC map (HEAD_H, HEAD_W, HEAD_CHANNELS): cls | box | dir. A
// batch's frames run in one set of launches, frame blockIdx.z on its own part of every per-frame
// buffer (frame_part); the anchors and the thresholds are the batch's.
//
// Same result as pointpillars_trt/reference/post.py: ties in every ordering go to the lower index
// (anchor index for the top-k, position for the per-class sorts and the final cut), IoU > threshold
// suppresses, boxes are written in OpenPCDet's convention whatever the family. The NMS geometry
// follows the families' kernels (corner margin, strict tests, angular bubble sort, fan area) in
// float32. Nothing syncs with the host: every count lives in `stats`, every grid is sized from
// capacities. The run-time thresholds (score threshold, NMS IoU, max boxes) are read from the small
// device buffer `thresholds` (slots THRESHOLD_*), so a new value needs neither a recompilation nor a
// new CUDA graph: the graph holds the buffer's address, the kernels read its contents. Launch order,
// one stream (the blocks below are a frame's):
//   pp_score      per anchor: max class probability; block counts of those passing the threshold;
//                 the overflowed class logits counted (STAT_OVERFLOWED_SCORES, zeroed by pp_nms_reduce)
//   pp_compact    per anchor: candidates in anchor order (each block sums the counts before its own;
//                 the last block writes the candidate count)
//   pp_select     one block: top TOP_K by (score desc, anchor asc): radix select + bitonic sort
//   pp_group      one block per NMS group (1 group class-agnostic, one per class otherwise):
//                 members in NMS order, decoded boxes, NMS rectangles
//   pp_nms_mask   the IoU > threshold bit matrix (upper triangle), one pair a thread
//   pp_nms_reduce one block: greedy pass per group, final cut, output range, output rows
//
// Compile-time configuration (-D options from postprocess.py): HEAD_W, HEAD_H, HEAD_CHANNELS, ANCHORS_PER_CELL,
// NUM_CLASSES, DIR_BINS, STYLE_OPENPCDET (box coder / NMS geometry: 1 OpenPCDet, 0 zhulf0804),
// PER_CLASS, SCORE_INCLUSIVE, TOP_K, SORT_CAP, FINAL_CAP, NMS_MARGIN, OVERFLOWED_LOGIT,
// MAX_BOXES (the cap the output is sized for; the run-time max boxes is at most this), DIR_OFFSET,
// DIR_LIMIT_OFFSET, DIR_FLIP_BIN, DIR_PERIOD, HAS_OUTPUT_RANGE, OUT_MIN_[XYZ],
// OUT_MAX_[XYZ], SCORE_BLOCK, NMS_RECT_FLOATS, NMS_MASK_THREADS, STAT_* (slots of stats), HEADER_* (slots of the output's header row),
// THRESHOLD_* (slots of `thresholds`: float32 score threshold, NMS IoU, max boxes), STAT_COUNT (a frame's
// stats).
#include "common.cuh"
#include "result_header.cuh"
#include "rotated_nms.cuh"
#include "score_keys.cuh"

namespace {

constexpr int kPlane = HEAD_W * HEAD_H;
constexpr int kNumAnchors = kPlane * ANCHORS_PER_CELL;
constexpr int kGroups = PER_CLASS ? NUM_CLASSES : 1;
constexpr int kRowFloats = 9;  // x, y, z, dx, dy, dz, heading, score, label
constexpr int kScoreBlocks = (kNumAnchors + SCORE_BLOCK - 1) / SCORE_BLOCK;  // pp_score's blocks a frame
constexpr long long kHeadValues = static_cast<long long>(kPlane) * HEAD_CHANNELS;  // a frame's head map
constexpr long long kSlots = static_cast<long long>(kGroups) * SORT_CAP;  // a frame's NMS group members

// ---------------------------------------------------------------- scores

// Flat anchor a = (y * W + x) * A + anchor-in-cell; channel `ch` of its cell in one part (cls, box
// or dir: `part` points at the part's first channel) of the merged NHWC head map.
__device__ __forceinline__ float head(const float* part, int width, int a, int ch) {
    const int pixel = a / ANCHORS_PER_CELL;
    const int in_cell = a - pixel * ANCHORS_PER_CELL;
    return part[pixel * HEAD_CHANNELS + width * in_cell + ch];
}

// Max class probability; *label = first class reaching it (argmax order); *overflows = the classes
// whose logit overflowed (``overflowed``), unless `overflows` is null (pp_group: pp_score counted
// its anchors' classes). A NaN logit makes the maximum NaN, as the references'
// maximum (and PyTorch's) gives it: the anchor passes no threshold.
__device__ __forceinline__ float best_class(const float* cls, int a, int* label, int* overflows) {
    float best = -1.0f;
    int nan = 0, over = 0;
    *label = 0;
    for (int c = 0; c < NUM_CLASSES; ++c) {
        const float logit = head(cls, NUM_CLASSES, a, c);
        nan |= isnan(logit);
        over += overflowed(logit);
        const float p = sigmoid(logit);
        if (p > best) {
            best = p;
            *label = c;
        }
    }
    if (overflows) *overflows = over;
    return nan ? __int_as_float(0x7fffffff) : best;
}


// ---------------------------------------------------------------- decoding

struct Decoded {
    float box[7];  // family-native; heading already folded by direction for OpenPCDet
    int dir;       // direction bin (argmax)
};

__device__ __forceinline__ float fold_direction(float angle, int dir) {
    const float v = __fsub_rn(angle, DIR_OFFSET);
    const float turns = floorf(__fadd_rn(__fdiv_rn(v, DIR_PERIOD), DIR_LIMIT_OFFSET));
    const float folded = __fsub_rn(v, __fmul_rn(turns, DIR_PERIOD));
    return __fadd_rn(__fadd_rn(folded, DIR_OFFSET), dir == DIR_FLIP_BIN ? DIR_PERIOD : 0.0f);
}

__device__ Decoded decode(const float* box, const float* dir, const float* anchors, int a) {
    const float* an = anchors + static_cast<size_t>(a) * 7;
    float t[7];
#pragma unroll
    for (int j = 0; j < 7; ++j) t[j] = head(box, 7, a, j);
    Decoded d;
    const float diag = __fsqrt_rn(__fadd_rn(__fmul_rn(an[3], an[3]), __fmul_rn(an[4], an[4])));
    d.box[0] = __fadd_rn(__fmul_rn(t[0], diag), an[0]);
    d.box[1] = __fadd_rn(__fmul_rn(t[1], diag), an[1]);
#pragma unroll
    for (int j = 3; j < 6; ++j) d.box[j] = __fmul_rn(an[j], expf(t[j]));
    d.box[6] = __fadd_rn(an[6], t[6]);
    const float z = __fadd_rn(__fmul_rn(t[2], an[5]), an[2]);
#if STYLE_OPENPCDET
    d.box[2] = z;  // ResidualCoder: centre to centre
#else
    d.box[2] = __fsub_rn(__fadd_rn(z, __fdiv_rn(an[5], 2.0f)), __fdiv_rn(d.box[5], 2.0f));
#endif
    d.dir = 0;
    float best = head(dir, DIR_BINS, a, 0);
    for (int j = 1; j < DIR_BINS; ++j) {
        const float v = head(dir, DIR_BINS, a, j);
        if (v > best) {
            best = v;
            d.dir = j;
        }
    }
#if STYLE_OPENPCDET
    d.box[6] = fold_direction(d.box[6], d.dir);  // OpenPCDet folds before NMS
#endif
    return d;
}

}  // namespace

// ---------------------------------------------------------------- kernels

extern "C" __global__ void pp_score(const float* __restrict__ cls, const float* __restrict__ thresholds,
                                    unsigned* __restrict__ key, int* __restrict__ block_counts,
                                    int* __restrict__ stats) {
    cls = frame_part(cls, kHeadValues);
    key = frame_part(key, kNumAnchors);
    block_counts = frame_part(block_counts, kScoreBlocks);
    stats = frame_part(stats, STAT_COUNT);
    const int a = blockIdx.x * blockDim.x + threadIdx.x;
    const float threshold = thresholds[THRESHOLD_SCORE];
    int pass = 0;
    int overflows = 0;
    if (a < kNumAnchors) {
        int label;
        const float score = best_class(cls, a, &label, &overflows);
        key[a] = __float_as_uint(score);
        pass = passes(score, threshold);
    }
    add_warp_count(&stats[STAT_OVERFLOWED_SCORES], overflows);  // pp_nms_reduce reads it, zeroes it for the next frame
    const int count = pp_block_sum(pass);
    if (threadIdx.x == 0) block_counts[blockIdx.x] = count;
}

// Each block finds its offset by summing pp_score's counts of the blocks before it (a few thousand
// ints, from L2) rather than waiting on a one-block scan kernel between the two.
extern "C" __global__ void pp_compact(const unsigned* __restrict__ key,
                                      const int* __restrict__ block_counts, const float* __restrict__ thresholds,
                                      int* __restrict__ stats, unsigned* __restrict__ cand_key,
                                      int* __restrict__ cand_anchor) {
    key = frame_part(key, kNumAnchors);
    block_counts = frame_part(block_counts, kScoreBlocks);
    stats = frame_part(stats, STAT_COUNT);
    cand_key = frame_part(cand_key, kNumAnchors);
    cand_anchor = frame_part(cand_anchor, kNumAnchors);
    const int a = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned k = a < kNumAnchors ? key[a] : 0u;
    const bool pass = a < kNumAnchors && passes(__uint_as_float(k), thresholds[THRESHOLD_SCORE]);
    int before = 0;
    for (int b = threadIdx.x; b < static_cast<int>(blockIdx.x); b += blockDim.x) before += block_counts[b];
    const int offset = pp_block_sum(before);
    int own;
    const int pos = offset + pp_block_exclusive_scan(pass, &own);
    if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) stats[STAT_CANDIDATES] = offset + own;
    if (pass) {
        cand_key[pos] = k;
        cand_anchor[pos] = a;
    }
}

// Top TOP_K candidates by (score desc, anchor asc), sorted. When there are more candidates, an
// 8-bit-digit radix select finds the k-th score; ties at it are taken in anchor order.
extern "C" __global__ void __launch_bounds__(1024)
pp_select(const unsigned* __restrict__ cand_key, const int* __restrict__ cand_anchor,
          int* __restrict__ stats, int* __restrict__ sel_anchor, float* __restrict__ sel_score) {
    __shared__ unsigned long long keys[SORT_CAP];
    cand_key = frame_part(cand_key, kNumAnchors);
    cand_anchor = frame_part(cand_anchor, kNumAnchors);
    stats = frame_part(stats, STAT_COUNT);
    sel_anchor = frame_part(sel_anchor, SORT_CAP);
    sel_score = frame_part(sel_score, SORT_CAP);
    const int n = stats[STAT_CANDIDATES];
    const int k = min(n, TOP_K);
    if (n <= TOP_K) {
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            keys[i] = score_key(__uint_as_float(cand_key[i]), cand_anchor[i]);
    } else {
        select_top_keys(cand_key, n, TOP_K, keys,
                        [&](int i, unsigned u) { return score_key(__uint_as_float(u), cand_anchor[i]); });
    }
    const int sorted = pow2_at_least(k);
    for (int i = k + threadIdx.x; i < sorted; i += blockDim.x) keys[i] = 0ull;
    pp_bitonic_sort_desc(keys, sorted);
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        sel_anchor[j] = static_cast<int>(key_index(keys[j]));
        sel_score[j] = key_score(keys[j]);
    }
    if (threadIdx.x == 0) stats[STAT_SELECTED] = k;
}

// Members of NMS group g in the order NMS visits them, decoded. Class-agnostic: the selected
// anchors as they are (any number of blocks share the decoding). Per class: one block per class
// takes those whose class probability passes, by (probability desc, top-k position asc).
extern "C" __global__ void __launch_bounds__(PER_CLASS ? 1024 : 256)  // the class-agnostic blocks are 256 threads
pp_group(const float* __restrict__ cls, const float* __restrict__ box,
         const float* __restrict__ dir, const float* __restrict__ anchors,
         const int* __restrict__ sel_anchor, const float* __restrict__ sel_score,
         const int* __restrict__ stats, const float* __restrict__ thresholds, int* __restrict__ group_count,
         float* __restrict__ group_box, float* __restrict__ group_rect,
         float* __restrict__ group_score, int* __restrict__ group_label, int* __restrict__ group_dir) {
    cls = frame_part(cls, kHeadValues);
    box = frame_part(box, kHeadValues);
    dir = frame_part(dir, kHeadValues);
    sel_anchor = frame_part(sel_anchor, SORT_CAP);
    sel_score = frame_part(sel_score, SORT_CAP);
    stats = frame_part(stats, STAT_COUNT);
    group_count = frame_part(group_count, kGroups);
    group_box = frame_part(group_box, kSlots * 7);
    group_rect = frame_part(group_rect, kSlots * kRectFloats);
    group_score = frame_part(group_score, kSlots);
    group_label = frame_part(group_label, kSlots);
    group_dir = frame_part(group_dir, kSlots);
    const int k = stats[STAT_SELECTED];
#if PER_CLASS
    const int g = blockIdx.x;
    const int first = threadIdx.x, stride = blockDim.x;
    __shared__ unsigned long long keys[SORT_CAP];
    const int sorted = pow2_at_least(k);
    const float threshold = thresholds[THRESHOLD_SCORE];
    int passing = 0;
    for (int j = threadIdx.x; j < sorted; j += blockDim.x) {
        unsigned long long key = 0ull;
        if (j < k) {
            const float p = sigmoid(head(cls, NUM_CLASSES, sel_anchor[j], g));
            if (passes(p, threshold)) {
                key = score_key(p, j);
                ++passing;
            }
        }
        keys[j] = key;
    }
    const int count = pp_block_sum(passing);
    pp_bitonic_sort_desc(keys, sorted);
#else
    const int g = 0;
    const int first = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
    const int count = k;
#endif
    for (int m = first; m < count; m += stride) {
#if PER_CLASS
        const int j = static_cast<int>(key_index(keys[m]));
        const float score = key_score(keys[m]);
        const int label = g;
#else
        const int j = m;
        const float score = sel_score[j];
        int label;
        best_class(cls, sel_anchor[j], &label, nullptr);
#endif
        const Decoded d = decode(box, dir, anchors, sel_anchor[j]);
        const int slot = g * SORT_CAP + m;
#pragma unroll
        for (int q = 0; q < 7; ++q) group_box[slot * 7 + q] = d.box[q];
        store_rect(group_rect + slot * kRectFloats, nms_rect(d.box));
        group_score[slot] = score;
        group_label[slot] = label;
        group_dir[slot] = d.dir;
    }
    if (threadIdx.x == 0 && (PER_CLASS || blockIdx.x == 0)) group_count[g] = count;
}

// Bit j of mask[(g, i), col block] is set when member j (> i) of group g overlaps member i by
// IoU > the run-time NMS IoU (nms_mask_words).
extern "C" __global__ void __launch_bounds__(NMS_MASK_THREADS)
pp_nms_mask(const int* __restrict__ group_count, const float* __restrict__ group_rect,
            const float* __restrict__ thresholds, unsigned long long* __restrict__ mask) {
    nms_mask_words(frame_part(group_count, kGroups), frame_part(group_rect, kSlots * kRectFloats),
                   thresholds[THRESHOLD_NMS_IOU], frame_part(mask, kSlots * kNmsColBlocks));
}

namespace {

// One output row in OpenPCDet's convention from a group slot.
__device__ __forceinline__ bool output_row(int slot, const float* group_box, const float* group_score,
                                           const int* group_label, const int* group_dir, float* row) {
    float b[7];
#pragma unroll
    for (int q = 0; q < 7; ++q) b[q] = group_box[slot * 7 + q];
#if HAS_OUTPUT_RANGE  // strict, on the family-native x, y, z
    if (!(b[0] > OUT_MIN_X && b[0] < OUT_MAX_X && b[1] > OUT_MIN_Y && b[1] < OUT_MAX_Y &&
          b[2] > OUT_MIN_Z && b[2] < OUT_MAX_Z))
        return false;
#endif
#if STYLE_OPENPCDET
#pragma unroll
    for (int q = 0; q < 7; ++q) row[q] = b[q];
#else
    // zhulf0804 folds the yaw after NMS, then (x, y, z_bottom, w, l, h, yaw) becomes
    // (x, y, z + h/2, l, w, h, -yaw - pi/2), rounded once from float64 as the reference does.
    const double yaw = fold_direction(b[6], group_dir[slot]);
    row[0] = b[0];
    row[1] = b[1];
    row[2] = static_cast<float>(static_cast<double>(b[2]) + static_cast<double>(b[5]) / 2.0);
    row[3] = b[4];
    row[4] = b[3];
    row[5] = b[5];
    row[6] = static_cast<float>(-yaw - 1.5707963267948966);
#endif
    row[7] = group_score[slot];
    row[8] = static_cast<float>(group_label[slot]);
    return true;
}

}  // namespace

// Greedy NMS per group over the bit matrix (greedy_nms_group), then the final cut (per class: top
// max_boxes by score only when more were kept), the output range filter and the rows. max_boxes is
// the run-time value, clamped to the MAX_BOXES cap.
// out: (MAX_BOXES + 1, 9) float32 a frame; row 0 is the header, rows 1.. the boxes. `extra`: the
// voxelizer's stats rows, extra_stride apart.
extern "C" __global__ void __launch_bounds__(256)
pp_nms_reduce(const int* __restrict__ group_count, const unsigned long long* __restrict__ mask,
              const float* __restrict__ group_box, const float* __restrict__ group_score,
              const int* __restrict__ group_label, const int* __restrict__ group_dir,
              int* __restrict__ stats, const int* __restrict__ extra, int extra_stride, int num_extra,
              const float* __restrict__ thresholds, int* __restrict__ kept, float* __restrict__ out) {
#if PER_CLASS
    __shared__ unsigned long long final_keys[FINAL_CAP];
#endif
    group_count = frame_part(group_count, kGroups);
    mask = frame_part(mask, kSlots * kNmsColBlocks);
    group_box = frame_part(group_box, kSlots * 7);
    group_score = frame_part(group_score, kSlots);
    group_label = frame_part(group_label, kSlots);
    group_dir = frame_part(group_dir, kSlots);
    stats = frame_part(stats, STAT_COUNT);
    extra = frame_part(extra, extra_stride);
    kept = frame_part(kept, kSlots);
    out = frame_part(out, (MAX_BOXES + 1LL) * kRowFloats);
    const int max_boxes = max(1, min(MAX_BOXES, static_cast<int>(thresholds[THRESHOLD_MAX_BOXES])));
    int total = 0;
    for (int g = 0; g < kGroups; ++g) {
        const int n = group_count[g];
        total += greedy_nms_group(mask, g, n, PER_CLASS ? n : max_boxes, kept + total);
    }
    __syncthreads();
    // kept[] now holds the group slots in concatenation order (group, then NMS order).
    int count = total;
#if PER_CLASS
    const bool cut = total > max_boxes;
    if (cut) {  // top max_boxes by (score desc, concatenation position asc); slot in the low bits
        const int sorted = pow2_at_least(total);
        for (int q = threadIdx.x; q < sorted; q += blockDim.x) {
            unsigned long long key = 0ull;
            if (q < total) {
                const int slot = kept[q];
                key = (static_cast<unsigned long long>(__float_as_uint(group_score[slot])) << 32) |
                      (static_cast<unsigned>(0xffff - q) << 16) | static_cast<unsigned>(slot);
            }
            final_keys[q] = key;
        }
        pp_bitonic_sort_desc(final_keys, sorted);
        count = max_boxes;
    }
#endif
    int written = 0;
    for (int base = 0; base < count; base += blockDim.x) {
        const int r = base + threadIdx.x;
        float row[kRowFloats];
        bool keep = false;
        if (r < count) {
#if PER_CLASS
            const int slot = cut ? static_cast<int>(final_keys[r] & 0xffffull) : kept[r];
#else
            const int slot = kept[r];
#endif
            keep = output_row(slot, group_box, group_score, group_label, group_dir, row);
        }
        int chunk;
        const int pos = written + pp_block_exclusive_scan(keep, &chunk);
        if (keep) {
#pragma unroll
            for (int q = 0; q < kRowFloats; ++q) out[(1 + pos) * kRowFloats + q] = row[q];
        }
        written += chunk;
    }
    write_result_header(out, kRowFloats, written, stats[STAT_CANDIDATES], stats[STAT_SELECTED],
                        stats[STAT_OVERFLOWED_SCORES], extra, num_extra);
    __syncthreads();  // every header thread has read the overflow count
    if (threadIdx.x == 0) stats[STAT_OVERFLOWED_SCORES] = 0;
}
