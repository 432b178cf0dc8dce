/*
 * dp/dp.h - everything public in dp: include this one header.
 */
#ifndef DP_DP_H
#define DP_DP_H

#include "dp/status.h"
#include "dp/dtype.h"
#include "dp/units.h"
#include "dp/checked.h"
#include "dp/atomic_file.h"
#include "dp/file.h"
#include "dp/rng.h"
#include "dp/device.h"
#include "dp/nn.h"
#include "dp/optim.h"
#include "dp/model.h"
#include "dp/ops.h"
#include "dp/dist.h"
#include "dp/engine.h"
#include "dp/gpt.h"
#include "dp/gpt_hf.h"
#include "dp/sample.h"
#include "dp/safetensors.h"
#include "dp/tokenizer.h"
#include "dp/data.h"
#include "dp/checkpoint.h"
#include "dp/trace.h"

#endif /* DP_DP_H */
