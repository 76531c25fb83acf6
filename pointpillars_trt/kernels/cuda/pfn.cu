// Pillar feature net, fused: decorated pillars (MAX_PILLARS, MAX_PTS, NUM_FEATURES) -> (MAX_PILLARS, OUT_CHANNELS).
//
// The network both families use: one linear map with BatchNorm folded in (weight, bias), ReLU, and the
// max over all MAX_PTS slots (padded slots are zero and take part, as in the references). It runs only
// on the live pillars (the count is read from device memory), so its cost follows the frame, not the
// buffer size an engine with a fixed shape would pay for.
//
// Compile-time configuration (-D options from pfn.py): MAX_PILLARS, MAX_PTS, NUM_FEATURES,
// OUT_CHANNELS, PILLARS_PER_BLOCK.
namespace {
constexpr int kPillarFloats = MAX_PTS * NUM_FEATURES;
}  // namespace

// Block (OUT_CHANNELS, PILLARS_PER_BLOCK): thread (c, y) computes channel c of pillar y of each group;
// a grid-stride loop over pillar groups keeps the grid small when the frame is.
extern "C" __global__ void pfn_forward(const float* __restrict__ pillars, const float* __restrict__ weight,
                                       const float* __restrict__ bias, const int* __restrict__ num_pillars,
                                       float* __restrict__ out) {
    __shared__ float s_weight[OUT_CHANNELS * NUM_FEATURES];
    __shared__ float s_points[PILLARS_PER_BLOCK][kPillarFloats];
    const int c = threadIdx.x;
    const int tid = threadIdx.y * OUT_CHANNELS + c;
    constexpr int kThreads = OUT_CHANNELS * PILLARS_PER_BLOCK;
    for (int i = tid; i < OUT_CHANNELS * NUM_FEATURES; i += kThreads) s_weight[i] = weight[i];
    const float b = bias[c];
    const int live = min(*num_pillars, MAX_PILLARS);
    for (int first = blockIdx.x * PILLARS_PER_BLOCK; first < live; first += gridDim.x * PILLARS_PER_BLOCK) {
        __syncthreads();  // the previous group's points are no longer read
        const int rows = min(PILLARS_PER_BLOCK, live - first);
        const float* src = pillars + static_cast<long long>(first) * kPillarFloats;
        for (int i = tid; i < rows * kPillarFloats; i += kThreads) s_points[i / kPillarFloats][i % kPillarFloats] = src[i];
        __syncthreads();
        if (threadIdx.y >= rows) continue;
        const float* w = s_weight + c * NUM_FEATURES;
        const float* x = s_points[threadIdx.y];
        float best = 0.0f;  // ReLU output is >= 0, so 0 is the identity of the max
#pragma unroll 4
        for (int m = 0; m < MAX_PTS; ++m) {
            float acc = 0.0f;
#pragma unroll
            for (int f = 0; f < NUM_FEATURES; ++f) acc = fmaf(x[m * NUM_FEATURES + f], w[f], acc);
            best = fmaxf(best, acc + b);
        }
        out[static_cast<long long>(first + threadIdx.y) * OUT_CHANNELS + c] = best;
    }
}
