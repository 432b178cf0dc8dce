/*
 * examples/regression/linreg.h - a linear regression as a dp_model:
 * logits(rows, O) = x(rows, D) @ weight(O, D)^T + bias(O), trained with
 * dp_criterion_mse on float targets y(rows, O) (NaN = a missing value).
 */
#ifndef DP_EXAMPLE_LINREG_H
#define DP_EXAMPLE_LINREG_H

#include <dp/dp.h>

typedef struct linreg {
    size_t in_dim, out_dim;     /* D, O */
    dp_param_tensor tensors[2]; /* weight (O, D), bias (O) */
} linreg;

/* Fills *model for D inputs and O outputs (net must outlive the model). */
void linreg_init_model(linreg *net, size_t in_dim, size_t out_dim, dp_model *model);

#endif /* DP_EXAMPLE_LINREG_H */
