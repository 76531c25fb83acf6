// Row 0 of a post-process result, as the host unpacks it (RESULT_HEADER in postprocess.py): the
// boxes written, the candidate, selected and overflowed class score counts, then the voxelizer's counts
// (`extra`). Needs HEADER_COUNT, HEADER_CANDIDATES, HEADER_SELECTED, HEADER_OVERFLOWED_SCORES and
// HEADER_EXTRA defined.
#ifndef PP_RESULT_HEADER_CUH
#define PP_RESULT_HEADER_CUH

// Threads [0, row_floats) of the calling block write one value each; the rest return.
__device__ __forceinline__ void write_result_header(float* __restrict__ out, int row_floats, int count,
                                                    int candidates, int selected, int overflowed_scores,
                                                    const int* __restrict__ extra, int num_extra) {
    const int t = threadIdx.x;
    if (t >= row_floats) return;
    float v = 0.0f;
    if (t == HEADER_COUNT) v = static_cast<float>(count);
    else if (t == HEADER_CANDIDATES) v = static_cast<float>(candidates);
    else if (t == HEADER_SELECTED) v = static_cast<float>(selected);
    else if (t == HEADER_OVERFLOWED_SCORES) v = static_cast<float>(overflowed_scores);
    else if (t >= HEADER_EXTRA && t - HEADER_EXTRA < num_extra) v = static_cast<float>(extra[t - HEADER_EXTRA]);
    out[t] = v;
}

#endif  // PP_RESULT_HEADER_CUH
