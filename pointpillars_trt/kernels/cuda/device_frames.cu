// A frame given on the GPU (any row and column strides) copied into the pipeline's input buffers on the
// pipeline's stream (kernels/device_frames.py): its x, y, z, intensity, its time lags where the model takes
// them (has_times), and its header pair (point count, first row), in one launch.
extern "C" __global__ void stage_device_frame(const float* frame, long long row_stride, long long column_stride,
                                              long long count, float4* rows, float* times, int has_times,
                                              int* header, int index, long long start) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count;
         i += (long long)gridDim.x * blockDim.x) {
        const float* row = frame + i * row_stride;
        rows[start + i] = make_float4(row[0], row[column_stride], row[2 * column_stride], row[3 * column_stride]);
        if (has_times) {
            times[start + i] = row[4 * column_stride];
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        header[2 * index] = (int)count;
        header[2 * index + 1] = (int)start;
    }
}
