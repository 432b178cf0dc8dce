/* scripts/gpu_probe.c - what the CUDA runtime sees on this machine, for
 * scripts/gpu-check: the CUDA version the driver supports, the runtime's own
 * version, and every device. Built by `scripts/gpu-check --pack` against the
 * same libcudart as libdp, so it answers the question dp's own error paths
 * cannot: is there no GPU, no driver, or a driver too old for this runtime?
 *
 * Prints key=value lines (driver_cuda, runtime, devices, device.N, verdict)
 * and exits 0 when at least one device is usable, 2 when no driver is
 * loadable, 3 when the driver is too old for the runtime, 4 when the driver
 * sees no device, 1 for any other error. */
#include <stdio.h>

#include <cuda_runtime_api.h>

/* CUDA encodes versions as 1000 * major + 10 * minor. */
static int major_of(int v) { return v / 1000; }
static int minor_of(int v) { return (v % 1000) / 10; }

int main(void)
{
    int drv = 0, rt = 0;
    cudaError_t de = cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    printf("runtime=%d.%d\n", major_of(rt), minor_of(rt));
    if (de != cudaSuccess || drv == 0) {
        /* cudaDriverGetVersion reports 0 when libcuda.so.1 cannot be loaded. */
        printf("driver_cuda=none\n");
        printf("verdict=no NVIDIA driver: libcuda.so.1 cannot be loaded (CUDA %d.%d runtime; "
               "CUDA 13 needs driver >= 580)\n", major_of(rt), minor_of(rt));
        return 2;
    }
    printf("driver_cuda=%d.%d\n", major_of(drv), minor_of(drv));
    if (major_of(drv) < major_of(rt)) {
        /* Minor-version compatibility covers a newer runtime of the same major
         * version only; an older major version cannot run this runtime. */
        printf("verdict=driver too old: it supports CUDA %d.%d, the runtime is CUDA %d.%d "
               "(CUDA 13 needs driver >= 580)\n",
               major_of(drv), minor_of(drv), major_of(rt), minor_of(rt));
        return 3;
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        printf("devices=0\n");
        printf("verdict=%s: %s (driver supports CUDA %d.%d, runtime %d.%d)\n", cudaGetErrorName(e),
               cudaGetErrorString(e), major_of(drv), minor_of(drv), major_of(rt), minor_of(rt));
        return e == cudaErrorInsufficientDriver ? 3 : e == cudaErrorNoDevice ? 4 : 1;
    }
    printf("devices=%d\n", n);
    for (int i = 0; i < n; i++) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
            printf("device.%d=(properties unavailable: %s)\n", i,
                   cudaGetErrorString(cudaGetLastError()));
            continue;
        }
        printf("device.%d=%s, sm_%d%d, %d SMs, %.1f GiB\n", i, p.name, p.major, p.minor,
               p.multiProcessorCount, (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    }
    if (n == 0) {
        printf("verdict=the driver sees no CUDA device\n");
        return 4;
    }
    printf("verdict=ok: %d device(s), driver supports CUDA %d.%d, runtime %d.%d%s\n", n,
           major_of(drv), minor_of(drv), major_of(rt), minor_of(rt),
           drv < rt ? " (minor-version compatibility: PTX newer than the driver cannot JIT)" : "");
    return 0;
}
