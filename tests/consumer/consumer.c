/* Built against an installed dp: opens a CPU device, runs a GEMM, checks it.
 * With --cuda it also asks for cuda:0: in a dp built with CUDA the
 * installed libdp must load its CUDA module (libdp-cuda, next to it) and
 * either open the device or say that no GPU is visible; built without,
 * it must say so. */
#include <stdio.h>
#include <string.h>

#include <dp/dp.h>

static int check_cuda(void)
{
    dp_device_spec spec = {DP_DEVICE_CUDA, 0};
    dp_device *dev = NULL;
    int count = dp_cuda_device_count();
    dp_status s = dp_device_open(&spec, &dev);
    if (s == DP_OK) {
        dp_device_close(dev);
        printf("consumer: cuda:0 opened (%d CUDA device%s)\n", count, count == 1 ? "" : "s");
        return 0;
    }
#ifdef DP_HAVE_CUDA
    if (count == 0 && s == DP_ERR_NO_DEVICE && !strstr(dp_last_error(), "could not be loaded")) {
        printf("consumer: the CUDA module loaded; no GPU visible here\n");
        return 0;
    }
    fprintf(stderr, "consumer: cuda:0 in a dp built with CUDA: %s\n", dp_last_error());
    return 1;
#else
    if (s == DP_ERR_NO_DEVICE && strstr(dp_last_error(), "no CUDA backend")) {
        printf("consumer: dp was built without CUDA, and says so\n");
        return 0;
    }
    fprintf(stderr, "consumer: cuda:0 in a dp built without CUDA: %s\n", dp_last_error());
    return 1;
#endif
}

int main(int argc, char **argv)
{
    dp_device_spec spec;
    size_t n = 0;
    dp_device *dev = NULL;
    if (dp_device_list_parse("cpu", &spec, 1, &n) != DP_OK || dp_device_open(&spec, &dev) != DP_OK) {
        fprintf(stderr, "consumer: %s\n", dp_last_error());
        return 1;
    }
    /* 2x2 column-major: C = A * B with A = [1 3; 2 4], B = I -> C = A. */
    float host_a[4] = {1, 2, 3, 4}, host_b[4] = {1, 0, 0, 1}, host_c[4] = {0};
    float *a, *b, *c;
    int ok = dp_device_alloc(dev, sizeof host_a, (void **)&a) == DP_OK &&
             dp_device_alloc(dev, sizeof host_b, (void **)&b) == DP_OK &&
             dp_device_alloc(dev, sizeof host_c, (void **)&c) == DP_OK &&
             dp_copy_h2d(dev, a, host_a, sizeof host_a) == DP_OK &&
             dp_copy_h2d(dev, b, host_b, sizeof host_b) == DP_OK &&
             dp_gemm(dev, DP_OP_N, DP_OP_N, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2) == DP_OK &&
             dp_copy_d2h(dev, host_c, c, sizeof host_c) == DP_OK;
    for (int i = 0; ok && i < 4; i++) ok = host_c[i] == host_a[i];
    dp_device_close(dev);
    if (!ok) {
        fprintf(stderr, "consumer: gemm through the installed dp failed: %s\n", dp_last_error());
        return 1;
    }
    printf("consumer: dp %s works\n", dp_strerror(DP_OK));
    if (argc > 1 && strcmp(argv[1], "--cuda") == 0) return check_cuda();
    return 0;
}
