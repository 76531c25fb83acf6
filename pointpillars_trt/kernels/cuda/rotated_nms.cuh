// Rotated BEV NMS as the families' kernels compute it, in float32 (no contraction): the rectangle
// each family's NMS sees, the overlap polygon (crossings, corners inside with the family's margin,
// angular bubble sort, fan area), the suppression test, the IoU bit matrix of NMS groups and the
// greedy pass over it. Shared by the post-process kernels. Needs STYLE_OPENPCDET (1: OpenPCDet
// geometry, 0: zhulf0804's), NMS_MARGIN, SORT_CAP (member slots a group, a multiple of 64) and
// NMS_COLUMN_SPLIT defined. Group g's members live at slots [g * SORT_CAP, g * SORT_CAP + count).
#ifndef PP_ROTATED_NMS_CUH
#define PP_ROTATED_NMS_CUH

namespace {

constexpr float kIouEps = 1e-8f;

// A rectangle as the family's NMS kernel sees it: centre, half extents, the angle its corners are
// rotated by (OpenPCDet: +heading; mmdet3d-style zhulf0804: -yaw) and its area.
struct Rect {
    float cx, cy, hx, hy, angle, area;
};
constexpr int kRectFloats = 6;

__device__ __forceinline__ Rect nms_rect(const float* b) {
    Rect r;
#if STYLE_OPENPCDET  // (x, y, z, dx, dy, dz, heading)
    r.cx = b[0];
    r.cy = b[1];
    r.hx = __fdiv_rn(b[3], 2.0f);
    r.hy = __fdiv_rn(b[4], 2.0f);
    r.angle = b[6];
    r.area = __fmul_rn(b[3], b[4]);
#else  // [x - w/2, y - l/2, x + w/2, y + l/2, yaw], as zhulf0804 hands its NMS
    const float hw = __fdiv_rn(b[3], 2.0f), hl = __fdiv_rn(b[4], 2.0f);
    const float x1 = __fsub_rn(b[0], hw), y1 = __fsub_rn(b[1], hl);
    const float x2 = __fadd_rn(b[0], hw), y2 = __fadd_rn(b[1], hl);
    r.cx = __fdiv_rn(__fadd_rn(x1, x2), 2.0f);
    r.cy = __fdiv_rn(__fadd_rn(y1, y2), 2.0f);
    r.hx = __fdiv_rn(__fsub_rn(x2, x1), 2.0f);
    r.hy = __fdiv_rn(__fsub_rn(y2, y1), 2.0f);
    r.angle = -b[6];
    r.area = __fmul_rn(__fsub_rn(x2, x1), __fsub_rn(y2, y1));
#endif
    return r;
}

struct Pt {
    float x, y;
};

__device__ __forceinline__ float cross3(Pt p1, Pt p2, Pt p0) {
    return __fsub_rn(__fmul_rn(__fsub_rn(p1.x, p0.x), __fsub_rn(p2.y, p0.y)),
                     __fmul_rn(__fsub_rn(p2.x, p0.x), __fsub_rn(p1.y, p0.y)));
}

__device__ __forceinline__ void corners_of(const Rect& r, float c, float s, Pt out[5]) {
    const float lx[4] = {-r.hx, r.hx, r.hx, -r.hx};
    const float ly[4] = {-r.hy, -r.hy, r.hy, r.hy};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        out[k].x = __fadd_rn(r.cx, __fsub_rn(__fmul_rn(lx[k], c), __fmul_rn(ly[k], s)));
        out[k].y = __fadd_rn(r.cy, __fadd_rn(__fmul_rn(lx[k], s), __fmul_rn(ly[k], c)));
    }
    out[4] = out[0];
}

// Corner test of the kernels: rotate into the box frame, strict against half extent + margin.
__device__ __forceinline__ bool inside(const Rect& r, float c, float s, Pt p) {
    const float dx = __fsub_rn(p.x, r.cx), dy = __fsub_rn(p.y, r.cy);
    const float lx = __fadd_rn(__fmul_rn(dx, c), __fmul_rn(dy, s));
    const float ly = __fadd_rn(__fmul_rn(-dx, s), __fmul_rn(dy, c));
    return fabsf(lx) < __fadd_rn(r.hx, NMS_MARGIN) && fabsf(ly) < __fadd_rn(r.hy, NMS_MARGIN);
}

// Edge p0->p1 of one box against edge q0->q1 of the other: strict crossing, as the kernels test it.
__device__ __forceinline__ bool crossing(Pt p0, Pt p1, Pt q0, Pt q1, Pt* at) {
    const bool boxes_meet = fminf(p0.x, p1.x) <= fmaxf(q0.x, q1.x) &&
                            fminf(q0.x, q1.x) <= fmaxf(p0.x, p1.x) &&
                            fminf(p0.y, p1.y) <= fmaxf(q0.y, q1.y) &&
                            fminf(q0.y, q1.y) <= fmaxf(p0.y, p1.y);
    if (!boxes_meet) return false;
    const float s1 = cross3(q0, p1, p0), s2 = cross3(p1, q1, p0);
    const float s3 = cross3(p0, q1, q0), s4 = cross3(q1, p1, q0);
    if (!(__fmul_rn(s1, s2) > 0.0f && __fmul_rn(s3, s4) > 0.0f)) return false;
    const float s5 = cross3(q1, p1, p0);
    const float den = __fsub_rn(s5, s1);
    if (fabsf(den) > kIouEps) {
        at->x = __fdiv_rn(__fsub_rn(__fmul_rn(s5, q0.x), __fmul_rn(s1, q1.x)), den);
        at->y = __fdiv_rn(__fsub_rn(__fmul_rn(s5, q0.y), __fmul_rn(s1, q1.y)), den);
    } else {
        const float a0 = __fsub_rn(p0.y, p1.y), b0 = __fsub_rn(p1.x, p0.x);
        const float c0 = __fsub_rn(__fmul_rn(p0.x, p1.y), __fmul_rn(p1.x, p0.y));
        const float a1 = __fsub_rn(q0.y, q1.y), b1 = __fsub_rn(q1.x, q0.x);
        const float c1 = __fsub_rn(__fmul_rn(q0.x, q1.y), __fmul_rn(q1.x, q0.y));
        const float det = __fsub_rn(__fmul_rn(a0, b1), __fmul_rn(a1, b0));
        at->x = __fdiv_rn(__fsub_rn(__fmul_rn(b0, c1), __fmul_rn(b1, c0)), det);
        at->y = __fdiv_rn(__fsub_rn(__fmul_rn(a1, c0), __fmul_rn(a0, c1)), det);
    }
    return true;
}

__device__ float overlap_area(const Rect& a, const Rect& b) {
    float ca, sa, cb, sb;
    sincosf(a.angle, &sa, &ca);
    sincosf(b.angle, &sb, &cb);
    Pt pa[5], pb[5];
    corners_of(a, ca, sa, pa);
    corners_of(b, cb, sb, pb);
    // At most 8 crossings of two convex quadrilaterals, plus 8 corners (the margin admits some
    // corners beside crossings); 24 slots leave room for any degenerate case.
    Pt poly[24];
    int n = 0;
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j)
            if (crossing(pa[i], pa[i + 1], pb[j], pb[j + 1], &poly[n])) ++n;
    for (int k = 0; k < 4; ++k) {
        if (inside(a, ca, sa, pb[k])) poly[n++] = pb[k];
        if (inside(b, cb, sb, pa[k])) poly[n++] = pa[k];
    }
    if (n < 3) return 0.0f;  // no area (the kernels' fan sum is zero here too)
    Pt centre = {0.0f, 0.0f};
    for (int k = 0; k < n; ++k) {
        centre.x = __fadd_rn(centre.x, poly[k].x);
        centre.y = __fadd_rn(centre.y, poly[k].y);
    }
    centre.x = __fdiv_rn(centre.x, static_cast<float>(n));
    centre.y = __fdiv_rn(centre.y, static_cast<float>(n));
    float angle[24];
    for (int k = 0; k < n; ++k)
        angle[k] = atan2f(__fsub_rn(poly[k].y, centre.y), __fsub_rn(poly[k].x, centre.x));
    // Bubble sort by angle, swapping only on a strict decrease: the kernels' stable order.
    for (int j = 0; j < n - 1; ++j)
        for (int i = 0; i < n - j - 1; ++i)
            if (angle[i] > angle[i + 1]) {
                const float ta = angle[i];
                angle[i] = angle[i + 1];
                angle[i + 1] = ta;
                const Pt tp = poly[i];
                poly[i] = poly[i + 1];
                poly[i + 1] = tp;
            }
    float area = 0.0f;
    for (int k = 1; k < n - 1; ++k) {
        const Pt u = {__fsub_rn(poly[k].x, poly[0].x), __fsub_rn(poly[k].y, poly[0].y)};
        const Pt v = {__fsub_rn(poly[k + 1].x, poly[0].x), __fsub_rn(poly[k + 1].y, poly[0].y)};
        area = __fadd_rn(area, __fsub_rn(__fmul_rn(u.x, v.y), __fmul_rn(u.y, v.x)));
    }
    return __fdiv_rn(fabsf(area), 2.0f);
}

__device__ __forceinline__ bool suppresses(const Rect& a, const Rect& b, float nms_iou) {
    // Farther apart than both circumradii plus both margins: no crossing edge, no corner inside,
    // so the kernels' overlap is exactly zero. The slack keeps float rounding on the safe side.
    const float reach = (sqrtf(a.hx * a.hx + a.hy * a.hy) + sqrtf(b.hx * b.hx + b.hy * b.hy) +
                         4.0f * NMS_MARGIN) * 1.001f + 1e-3f;
    const float dx = a.cx - b.cx, dy = a.cy - b.cy;
    if (dx * dx + dy * dy > reach * reach) return false;
    const float inter = overlap_area(a, b);
    const float iou = __fdiv_rn(inter, fmaxf(__fsub_rn(__fadd_rn(a.area, b.area), inter), kIouEps));
    return iou > nms_iou;
}

__device__ __forceinline__ Rect load_rect(const float* p) {
    return Rect{p[0], p[1], p[2], p[3], p[4], p[5]};
}

__device__ __forceinline__ void store_rect(float* p, const Rect& r) {
    p[0] = r.cx;
    p[1] = r.cy;
    p[2] = r.hx;
    p[3] = r.hy;
    p[4] = r.angle;
    p[5] = r.area;
}

constexpr int kNmsColBlocks = SORT_CAP / 64;

// Bit j of mask[(g, i), col block] is set when member j (> i) of group g overlaps member i by
// IoU > nms_iou. For a grid (col block, row block, group) of 64 * NMS_COLUMN_SPLIT threads; only
// the upper triangle is made.
__device__ __forceinline__ void nms_mask_tile(const int* __restrict__ group_count,
                                              const float* __restrict__ group_rect, float nms_iou,
                                              unsigned long long* __restrict__ mask) {
    // Block of 64 * NMS_COLUMN_SPLIT threads: thread (row r, part) tests row r of the tile against
    // its share of the 64 columns, and the parts' bits are OR-ed in shared memory. Splitting the
    // columns puts 4x more threads on the (expensive) polygon overlaps of dense candidate sets.
    __shared__ Rect cols[64];
    __shared__ unsigned long long row_bits[64];
    const int g = blockIdx.z;
    const int n = group_count[g];
    const int row0 = blockIdx.y * 64, col0 = blockIdx.x * 64;
    if (blockIdx.x < blockIdx.y || row0 >= n || col0 >= n) return;  // uniform over the block
    const int t = threadIdx.x;
    const int r = t & 63, part = t >> 6;
    constexpr int kShare = 64 / NMS_COLUMN_SPLIT;
    const int num_cols = min(64, n - col0);
    const float* rects = group_rect + static_cast<size_t>(g) * SORT_CAP * kRectFloats;
    if (t < num_cols) cols[t] = load_rect(rects + (col0 + t) * kRectFloats);
    if (t < 64) row_bits[t] = 0ull;
    __syncthreads();
    const int i = row0 + r;
    if (i < n) {
        const Rect mine = load_rect(rects + i * kRectFloats);
        const int first = max(blockIdx.x == blockIdx.y ? r + 1 : 0, part * kShare);
        const int last = min(num_cols, (part + 1) * kShare);
        unsigned long long bits = 0ull;
        for (int j = first; j < last; ++j)
            if (suppresses(mine, cols[j], nms_iou)) bits |= 1ull << j;
        if (bits) atomicOr(&row_bits[r], bits);
    }
    __syncthreads();
    if (part == 0 && i < n) mask[(static_cast<size_t>(g) * SORT_CAP + i) * kNmsColBlocks + blockIdx.x] = row_bits[r];
}

// Greedy NMS of group g (n members in visiting order) over its bit matrix, 64 members at a time,
// stopping at `limit` kept: within a tile the kept members follow from the diagonal words alone
// (one thread, one step per kept member); their rows are then ORed into the suppression words of
// the later tiles by the whole block. Writes the kept slots (g * SORT_CAP + member) to kept[0..]
// and returns how many; every thread of the block calls it and gets the count.
__device__ int greedy_nms_group(const unsigned long long* __restrict__ mask, int g, int n, int limit,
                                int* __restrict__ kept) {
    __shared__ unsigned long long removed[kNmsColBlocks];
    __shared__ unsigned long long diag[64];
    __shared__ int tile_kept[64];
    __shared__ int tile_kept_count;
    const int tiles = (n + 63) / 64;
    const unsigned long long* gmask = mask + static_cast<size_t>(g) * SORT_CAP * kNmsColBlocks;
    __syncthreads();  // the previous group's pass no longer reads the shared words
    for (int w = threadIdx.x; w < tiles; w += blockDim.x) removed[w] = 0ull;
    int group_kept = 0;
    for (int tile = 0; tile < tiles && group_kept < limit; ++tile) {
        const int rows = min(64, n - tile * 64);
        if (threadIdx.x < 64)
            diag[threadIdx.x] = threadIdx.x < rows
                ? gmask[static_cast<size_t>(tile * 64 + threadIdx.x) * kNmsColBlocks + tile] : 0ull;
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned long long valid = rows == 64 ? ~0ull : (1ull << rows) - 1ull;
            unsigned long long word = removed[tile];
            unsigned long long open = valid & ~word;
            int nk = 0;
            while (open && group_kept + nk < limit) {
                const int t = __ffsll(static_cast<long long>(open)) - 1;
                tile_kept[nk] = t;
                kept[group_kept + nk] = g * SORT_CAP + tile * 64 + t;
                ++nk;
                word |= diag[t];
                open = valid & ~word & ((~0ull << t) << 1);
            }
            tile_kept_count = nk;
        }
        __syncthreads();
        const int nk = tile_kept_count;
        group_kept += nk;
        const int later = tiles - tile - 1;
        for (int p = threadIdx.x; p < nk * later; p += blockDim.x) {
            const int which = p / later;
            const int w = tile + 1 + (p - which * later);
            const unsigned long long bits =
                gmask[static_cast<size_t>(tile * 64 + tile_kept[which]) * kNmsColBlocks + w];
            if (bits) atomicOr(&removed[w], bits);
        }
        __syncthreads();
    }
    return group_kept;
}

}  // namespace

#endif  // PP_ROTATED_NMS_CUH
