/*
 * core/bf16.c - the host's bfloat16 conversions (dp/dtype.h): the kernels'
 * own functions (kernels/bf16.h), so the host rounds as every device does.
 */
#include "dp/dtype.h"
#include "kernels/bf16.h"

dp_bf16 dp_bf16_from_float(float x) { return dp_bf16_round(x); }

float dp_bf16_to_float(dp_bf16 x) { return dp_bf16_widen(x); }
