// One thread that spins for `cycles` SM clock cycles: a stream held busy while the host queues the
// work to be timed behind it (kernels/hold.py).
extern "C" __global__ void hold_stream(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
