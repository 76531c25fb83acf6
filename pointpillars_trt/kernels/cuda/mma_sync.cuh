// PTX wrappers of the tensor-core kernels (neck_head.cu, neck_head_wgmma.cu, multihead_rpn.cu): cp.async,
// ldmatrix, mma.sync m16n8k16 on float16 and m16n8k8 on TF32 (float32 accumulation both) and the packing
// of their operands. No header of the CUDA toolkit (the wgmma kernel is compiled for sm_90a without an
// include path).
namespace {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; src_bytes = 0 writes zeros (src is not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x2(unsigned (&r)[2], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// float32 -> TF32 (10 mantissa bits), to nearest with ties away from zero: the tensor cores would truncate.
__device__ __forceinline__ unsigned to_tf32(float v) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
    return r;
}

// b0, b1: TF32 values already (the packed weights are rounded once on the host).
__device__ __forceinline__ void mma1688(float (&d)[4], const unsigned (&a)[4], float b0, float b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)));
}

// The m16n8k8 TF32 operands from float32 rows in shared memory. A lane holds A's and B's values at k
// (2t, 2t + 1) of a step of 8, where the PTX layout names (t, t + 4): A and B share the permutation, so the
// sum is the same and a pair is one 64-bit load.
// An A fragment, rounded to TF32 as it is read: rows g and g + 8 (`p0` points at row g's values 2t, 2t + 1;
// rows lie `pitch` values apart).
__device__ __forceinline__ void a_fragment(unsigned (&a)[4], const float* p0, int pitch) {
    const float2 lo = *reinterpret_cast<const float2*>(p0), hi = *reinterpret_cast<const float2*>(p0 + 8 * pitch);
    a[0] = to_tf32(lo.x);
    a[1] = to_tf32(hi.x);
    a[2] = to_tf32(lo.y);
    a[3] = to_tf32(hi.y);
}

// d += A times B's column at `q` (its values 2t, 2t + 1: TF32 values already).
__device__ __forceinline__ void mma_step(float (&d)[4], const unsigned (&a)[4], const float* q) {
    const float2 b = *reinterpret_cast<const float2*>(q);
    mma1688(d, a, b.x, b.y);
}

// relu(lo), relu(hi) rounded to float16 (to nearest even), lo in the low half: an A fragment register.
__device__ __forceinline__ unsigned pack_relu(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(fmaxf(hi, 0.0f)), "f"(fmaxf(lo, 0.0f)));
    return r;
}

}  // namespace
