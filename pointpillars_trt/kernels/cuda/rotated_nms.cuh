// Rotated BEV NMS as the families' kernels compute it, in float32 (no contraction): the rectangle
// each family's NMS sees, the overlap polygon (crossings, corners inside with the family's margin,
// angular bubble sort, fan area), the suppression test, the IoU bit matrix of NMS groups and the
// greedy pass over it. Shared by the post-process kernels. Needs STYLE_OPENPCDET (1: OpenPCDet
// geometry, 0: zhulf0804's), NMS_MARGIN, SORT_CAP (member slots a group, a multiple of 64) and
// NMS_RECT_FLOATS (floats a stored rectangle, as the host allocates them) defined. Group g's members
// live at slots [g * SORT_CAP, g * SORT_CAP + count).
#ifndef PP_ROTATED_NMS_CUH
#define PP_ROTATED_NMS_CUH

namespace {

constexpr float kIouEps = 1e-8f;

struct Pt {
    float x, y;
};

// A rectangle as the family's NMS kernel sees it: centre, half extents, the cosine and sine of the
// angle its corners are rotated by (OpenPCDet: +heading; mmdet3d-style zhulf0804: -yaw), its area,
// circumradius and corners. Everything a pair test needs that depends on one rectangle only is
// computed once, when the member is stored, with the same float32 operations the pair test used to
// repeat for every pair.
struct __align__(16) Rect {  // load_rect / store_rect move it as float4s
    float cx, cy, hx, hy, cos, sin, area, radius;
    Pt corner[4];
};
constexpr int kRectFloats = sizeof(Rect) / sizeof(float);
static_assert(kRectFloats == NMS_RECT_FLOATS, "the host allocates NMS_RECT_FLOATS floats a rectangle");
static_assert(kRectFloats % 4 == 0, "a rectangle is whole float4s");

__device__ __forceinline__ void set_corners(Rect& r) {
    const float lx[4] = {-r.hx, r.hx, r.hx, -r.hx};
    const float ly[4] = {-r.hy, -r.hy, r.hy, r.hy};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        r.corner[k].x = __fadd_rn(r.cx, __fsub_rn(__fmul_rn(lx[k], r.cos), __fmul_rn(ly[k], r.sin)));
        r.corner[k].y = __fadd_rn(r.cy, __fadd_rn(__fmul_rn(lx[k], r.sin), __fmul_rn(ly[k], r.cos)));
    }
}

__device__ __forceinline__ Rect nms_rect(const float* b) {
    Rect r;
    float angle;
#if STYLE_OPENPCDET  // (x, y, z, dx, dy, dz, heading)
    r.cx = b[0];
    r.cy = b[1];
    r.hx = __fdiv_rn(b[3], 2.0f);
    r.hy = __fdiv_rn(b[4], 2.0f);
    angle = b[6];
    r.area = __fmul_rn(b[3], b[4]);
#else  // [x - w/2, y - l/2, x + w/2, y + l/2, yaw], as zhulf0804 hands its NMS
    const float hw = __fdiv_rn(b[3], 2.0f), hl = __fdiv_rn(b[4], 2.0f);
    const float x1 = __fsub_rn(b[0], hw), y1 = __fsub_rn(b[1], hl);
    const float x2 = __fadd_rn(b[0], hw), y2 = __fadd_rn(b[1], hl);
    r.cx = __fdiv_rn(__fadd_rn(x1, x2), 2.0f);
    r.cy = __fdiv_rn(__fadd_rn(y1, y2), 2.0f);
    r.hx = __fdiv_rn(__fsub_rn(x2, x1), 2.0f);
    r.hy = __fdiv_rn(__fsub_rn(y2, y1), 2.0f);
    angle = -b[6];
    r.area = __fmul_rn(__fsub_rn(x2, x1), __fsub_rn(y2, y1));
#endif
    sincosf(angle, &r.sin, &r.cos);
    r.radius = sqrtf(r.hx * r.hx + r.hy * r.hy);
    set_corners(r);
    return r;
}

__device__ __forceinline__ float cross3(Pt p1, Pt p2, Pt p0) {
    return __fsub_rn(__fmul_rn(__fsub_rn(p1.x, p0.x), __fsub_rn(p2.y, p0.y)),
                     __fmul_rn(__fsub_rn(p2.x, p0.x), __fsub_rn(p1.y, p0.y)));
}

// Corner test of the kernels: rotate into the box frame, strict against half extent + margin.
__device__ __forceinline__ bool inside(const Rect& r, Pt p) {
    const float dx = __fsub_rn(p.x, r.cx), dy = __fsub_rn(p.y, r.cy);
    const float lx = __fadd_rn(__fmul_rn(dx, r.cos), __fmul_rn(dy, r.sin));
    const float ly = __fadd_rn(__fmul_rn(-dx, r.sin), __fmul_rn(dy, r.cos));
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
    const Pt* pa = a.corner;
    const Pt* pb = b.corner;
    // At most 8 crossings of two convex quadrilaterals, plus 8 corners (the margin admits some
    // corners beside crossings); 24 slots leave room for any degenerate case.
    Pt poly[24];
    int n = 0;
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j)
            if (crossing(pa[i], pa[(i + 1) & 3], pb[j], pb[(j + 1) & 3], &poly[n])) ++n;
    for (int k = 0; k < 4; ++k) {
        if (inside(a, pb[k])) poly[n++] = pb[k];
        if (inside(b, pa[k])) poly[n++] = pa[k];
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
    // Rectangles whose bounding boxes, grown by both margins, are apart, or whose centres are
    // farther apart than both circumradii plus both margins, have no crossing edge and no corner
    // inside: the kernels' overlap is exactly zero. (A corner inside with the margin lies within
    // the other's bounding box grown by margin * (|cos| + |sin|) <= 2 * margin.) The slack keeps
    // float rounding on the safe side.
    const float dx = a.cx - b.cx, dy = a.cy - b.cy;
    const float slack = 4.0f * NMS_MARGIN + 1e-3f;
    const float ca = fabsf(a.cos), sa = fabsf(a.sin), cb = fabsf(b.cos), sb = fabsf(b.sin);
    if (fabsf(dx) > (a.hx * ca + a.hy * sa + b.hx * cb + b.hy * sb) * 1.001f + slack) return false;
    if (fabsf(dy) > (a.hx * sa + a.hy * ca + b.hx * sb + b.hy * cb) * 1.001f + slack) return false;
    const float reach = (a.radius + b.radius + 4.0f * NMS_MARGIN) * 1.001f + 1e-3f;
    if (dx * dx + dy * dy > reach * reach) return false;
    const float inter = overlap_area(a, b);
    const float iou = __fdiv_rn(inter, fmaxf(__fsub_rn(__fadd_rn(a.area, b.area), inter), kIouEps));
    return iou > nms_iou;
}

__device__ __forceinline__ Rect load_rect(const float* p) {
    Rect r;
    float4* dst = reinterpret_cast<float4*>(&r);
    const float4* src = reinterpret_cast<const float4*>(p);
#pragma unroll
    for (int k = 0; k < kRectFloats / 4; ++k) dst[k] = src[k];
    return r;
}

__device__ __forceinline__ void store_rect(float* p, const Rect& r) {
    const float4* src = reinterpret_cast<const float4*>(&r);
    float4* dst = reinterpret_cast<float4*>(p);
#pragma unroll
    for (int k = 0; k < kRectFloats / 4; ++k) dst[k] = src[k];
}

constexpr int kNmsColBlocks = SORT_CAP / 64;

// Bit j of mask[(g, i), column block] is set when member j (> i) of group g overlaps member i by
// IoU > nms_iou; only the words a greedy pass reads (column block >= row i's block) are written.
// For a grid (any, groups) of blocks of a multiple of 64 threads: 64 threads make one word (row i,
// column block c), one pair each, each warp's 32 tests one ballot, and the blocks stride over
// the n * blocks(n) words of their group. A pair a thread keeps the chain of dependent work short:
// a small candidate set's few words are done in one polygon's time, where a thread walking a
// row's columns did up to 16 of them one after another.
static_assert(NMS_MASK_THREADS % 64 == 0, "64 threads make a word: whole words a block");

__device__ __forceinline__ void nms_mask_words(const int* __restrict__ group_count,
                                               const float* __restrict__ group_rect, float nms_iou,
                                               unsigned long long* __restrict__ mask) {
    const int g = blockIdx.y;
    const int n = group_count[g];
    const int col_blocks = (n + 63) >> 6;
    const int words = n * col_blocks;
    const float* rects = group_rect + static_cast<size_t>(g) * SORT_CAP * kRectFloats;
    unsigned* halves = reinterpret_cast<unsigned*>(mask + static_cast<size_t>(g) * SORT_CAP * kNmsColBlocks);
    const int lane = threadIdx.x & 63;
    const int per_block = blockDim.x >> 6;
    for (int w = blockIdx.x * per_block + (threadIdx.x >> 6); w < words; w += gridDim.x * per_block) {
        const int i = w / col_blocks, c = w - i * col_blocks;  // the same for both warps of the word
        if (c < (i >> 6)) continue;  // below the diagonal block: never read
        const int j = c * 64 + lane;
        bool hit = false;
        if (j > i && j < n) hit = suppresses(load_rect(rects + i * kRectFloats), load_rect(rects + j * kRectFloats), nms_iou);
        const unsigned bits = __ballot_sync(0xffffffffu, hit);
        if ((threadIdx.x & 31) == 0) halves[(static_cast<size_t>(i) * kNmsColBlocks + c) * 2 + (lane >> 5)] = bits;
    }
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
