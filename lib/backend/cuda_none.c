/*
 * backend/cuda_none.c - the CUDA entry points in a build without the CUDA
 * backend: no devices, and cuda:i is a clear error at dp_device_open.
 */
#include "backend/backend.h"

const dp_backend_ops *dp_backend_cuda(void) { return NULL; }

int dp_backend_cuda_count(void) { return 0; }
