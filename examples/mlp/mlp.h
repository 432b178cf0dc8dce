/*
 * examples/mlp/mlp.h - a 2-layer MLP classifier implementing dp_model.
 *
 * logits(rows, K) = fc2(dropout(act(fc1(x)))), x(rows, D) float inputs,
 * one integer class target per row; act is GELU (the default), ReLU or
 * SiLU, and dropout (in training steps only) is off unless asked for.
 */
#ifndef DP_EXAMPLE_MLP_H
#define DP_EXAMPLE_MLP_H

#include <dp/dp.h>

typedef enum mlp_activation { MLP_GELU = 0, MLP_RELU, MLP_SILU } mlp_activation;

typedef struct mlp_config {
    size_t in_dim;  /* D */
    size_t hidden;  /* H */
    size_t classes; /* K */
    /* the replicas' parameter type: DP_DTYPE_F32 (0, default) or
     * DP_DTYPE_BF16 (bf16 replicas, float32 masters in the engine) */
    dp_dtype param_dtype;
} mlp_config;

typedef struct mlp {
    mlp_config cfg;
    dp_param_tensor tensors[4]; /* fc1.weight (H,D), fc1.bias (H), fc2.weight (K,H), fc2.bias (K) */
    /* mlp_init_model sets GELU and no dropout; change them before the
     * engine is created */
    mlp_activation activation; /* the hidden layer's */
    float dropout;             /* drop probability after the activation (0: none) */
    size_t n_params;           /* the flat buffer's elements (mlp_init_model) */
} mlp;

/* Fills *model for the network in *net (which must outlive the model). */
void mlp_init_model(mlp *net, const mlp_config *cfg, dp_model *model);

#endif /* DP_EXAMPLE_MLP_H */
