#!/usr/bin/env bash
# tests/gpu_speed_as_cpu.sh PACK OUT - scripts/gpu-check's speed sweep
# (--run PACK --speed) on CPU devices (--as-cpu), so that the script a GPU
# session's few minutes depend on is known to run: every dp_bench part of
# the sweep passes with its figures (ms/step, tokens/s, peak, memory per
# sequence), the PyTorch parts pass or skip with a reason, nothing else of
# the sweep fails. The machine's own parts (gpus, driver) may fail here.
set -uo pipefail
pack=${1:?usage: gpu_speed_as_cpu.sh PACK OUT}
out=${2:?usage: gpu_speed_as_cpu.sh PACK OUT}
root=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$out"
"$root/scripts/gpu-check" --run "$pack" --speed --as-cpu --budget 200 --out "$out" >/dev/null 2>&1
s="$out/summary.txt"
[ -f "$s" ] || { echo "no summary at $s"; exit 1; }
fail=0
want() { grep -qE "$1" "$s" || { echo "missing: $1"; fail=1; }; }
# the rows of the default attention name cuDNN where the pack's module
# loads here (the sweep's "cudnn" part), as it does on a GPU machine
c=""
grep -qE "^cudnn +PASS" "$s" && c="cudnn "
runs=("bf16 chunked B8" "bf16 fused B8" "bf16 fused cudnn B8" "bf16 fused gelu-epilogue B8"
    "bf16 fused cudnn gelu-epilogue logits-chunk 8192 B8"
    "bf16 fused cudnn gelu-epilogue logits-chunk 8192 B64"
    "bf16 fused no-tensor-cores B8" "bf16 fused no-16-byte-elementwise B8" "bf16 fused V1000 B8"
    "bf16 fused ${c}layernorm-block-rows B8" "bf16 fused ${c}cuda-graphs B8"
    "bf16 fused cudnn gelu-epilogue logits-chunk 8192 cuda-graphs B8"
    "bf16 fused ${c}B16" "bf16 fused ${c}B32" "bf16 fused ${c}B64" "bf16 fused B64"
    "bf16 fused ${c}B16 on cpu:2" "bf16 fused ${c}overlap-comm-stream B16 on cpu:2"
    "bf16 fused ${c}recompute-gelu B8" "bf16 fused ${c}recompute-gelu B16"
    "bf16 fused ${c}V1000-padded B8" "bf16 fused ${c}logits-chunk 8192 B8"
    "bf16 fused ${c}no-cuBLASLt B8"
    "bf16 chunked B16" "bf16 chunked B32" "bf16 chunked B64"
    "bf16 whole B8" "fp32 whole B8" "fp32 whole B16" "tf32 whole B8" "tf32 whole B16")
for p in "${runs[@]}"; do
    want "^speed dp $p +(PASS +[0-9.]+ ms/step, [0-9]+ tokens/s, peak [0-9]+ MiB|SKIP +no cuDNN)"
done
for w in dp cudnn; do
    want "^speed attention $w B,T,C,NH=2,64,128,2 +(PASS +forward \+ backward [0-9.]+ ms|SKIP +no cuDNN)"
done
want "^speed dp bf16 chunked B32 +PASS .*MiB per sequence beyond the fixed state"
want "^speed dp bf16 fused ${c}cuda-graphs B8 +PASS .*; replayed [0-9]+ of [0-9]+ steps$"
want "^speed dp bf16 fused ${c}B32 +PASS .*MiB per sequence beyond the fixed state"
want "^speed dp bf16 fused ${c}recompute-gelu B16 +PASS .*MiB per sequence beyond the fixed state"
want "^speed torch bf16 B8 eager +(PASS +[0-9.]+ ms/step|SKIP +.+)"
want "^speed torch bf16 B8 compile +(PASS +[0-9.]+ ms/step|SKIP +.+)"
want "^speed llm.c bf16 B8 +SKIP"
want "^speed kernels bf16 fused B8 +SKIP"
want "^speed kernels bf16 chunked B8 +SKIP"
[ -n "$c" ] && want "^speed kernels bf16 cudnn B8 +SKIP"
if grep -E "^speed .* FAIL" "$s"; then fail=1; fi
if grep -qE "^(gpu-tests|train|resume|bench|vs-torch)" "$s"; then
    echo "--speed ran the check's other parts"; fail=1
fi
[ "$fail" -eq 0 ] || cat "$s"
exit "$fail"
