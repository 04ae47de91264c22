#!/usr/bin/env bash
# GPU check: the reference trainer (nemogym-train) on CUDA for a few steps, with its phase
# breakdown; then the same with real vLLM sampling, where vLLM is installed; then a bfloat16
# learner (its sampler-learner mismatch); then, with two or more GPUs, torchrun with NCCL and
# the policy sharded with FSDP2.
#
# Needs, on the GPU machine (no internet needed):
#   - the SDK's interpreter with a CUDA build of torch, transformers and peft
#     (pip install -e '.[train]'), default .venv/bin/python, or set PYTHON;
#   - NeMo Gym's venv (.venv-gym, or $NEMOGYM_GYM_VENV): the environments, the SDK's toy
#     target_chars included, run as NeMo Gym servers, so there is no run without it;
#   - optional: a venv with vllm (.venv-vllm, or $NEMOGYM_VLLM_VENV, or vllm importable by
#     $PYTHON) for the second run.
#
# The model is built in process (nothing is downloaded): a randomly initialised Llama of the
# tiny model's architecture and byte-level tokenizer, scaled up (default hidden 1024, 8 layers,
# 16 heads of 64: ~100M parameters), saved to OUT/model and passed as --model.
#
# Usage: benchmarks/gpu_check.sh [OUT]          (default OUT: a new temporary directory)
# Knobs (environment variables):
#   GPU_CHECK_DEVICE  cuda (default) or cuda:N; cpu runs the same script without a GPU
#   GPU_CHECK_STEPS   training steps per run (default 5; the breakdown leaves out step 0)
#   GPU_CHECK_ROWS    groups of 8 rollouts per step (default 4)
#   GPU_CHECK_MODEL   hidden,layers,heads of the model (default 1024,8,16)
#   GPU_CHECK_VLLM    0 skips the vLLM run
#   GPU_CHECK_NCCL    0 skips the torchrun run (it needs 2+ GPUs: one per NCCL process)
# Exit status: 0 when every run it started finished; 3 when a prerequisite is missing.
set -euo pipefail

cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
DEVICE=${GPU_CHECK_DEVICE:-cuda}
STEPS=${GPU_CHECK_STEPS:-5}
ROWS=${GPU_CHECK_ROWS:-4}
SHAPE=${GPU_CHECK_MODEL:-1024,8,16}
OUT=${1:-$(mktemp -d -t gpu-check-XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

say() { printf '\n== %s\n' "$*"; }
stop() { printf '\ngpu_check: %s\n' "$*" >&2; exit 3; }

say "1. torch, CUDA, transformers, peft ($PYTHON)"
"$PYTHON" - "$DEVICE" <<'EOF' || stop "fix the above, then run again"
import sys

try:
    import peft
    import torch
    import transformers
except ImportError as error:
    sys.exit(f"{error.name} is not installed: pip install -e '.[train]' (a CUDA build of torch)")
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"transformers {transformers.__version__}, peft {peft.__version__}")
device = sys.argv[1]
if device != "cpu":
    if not torch.cuda.is_available():
        sys.exit("torch.cuda.is_available() is False: "
                 + ("this torch is a CPU-only build; install a CUDA one"
                    if torch.version.cuda is None else "no GPU visible (nvidia-smi, "
                    "CUDA_VISIBLE_DEVICES)"))
    index = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(index)
    print(f"{device}: {props.name}, {props.total_memory / 2**30:.0f} GiB, "
          f"{torch.cuda.device_count()} GPU(s) visible")
EOF

say "2. NeMo Gym (the environments' servers)"
"$PYTHON" - <<'EOF' ||
import sys

from nemogym_sdk.gym.locate import find_gym_venv

try:
    print(find_gym_venv().root)
except Exception as error:  # GymVenvNotFoundError: what is missing
    sys.exit(str(error))
EOF
  stop "NeMo Gym is needed: nemogym-train's environments (the toy target_chars too) run as \
NeMo Gym servers, and the SDK has no path without them. Create .venv-gym with \`make gym-venv\` \
(needs the internet, or a wheel of nemo-gym 0.7.0 and its dependencies), or point \
NEMOGYM_GYM_VENV at an existing one; nothing was trained."

say "3. the model: a tiny-architecture Llama, $SHAPE (hidden,layers,heads), built in process"
"$PYTHON" - "$OUT/model" "$SHAPE" <<'EOF'
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from nemogym_sdk.serve.tiny import build_tiny_tokenizer

directory, shape = sys.argv[1], sys.argv[2]
hidden, layers, heads = (int(v) for v in shape.split(","))
tokenizer = build_tiny_tokenizer()
config = LlamaConfig(
    vocab_size=len(tokenizer),
    hidden_size=hidden,
    intermediate_size=hidden * 11 // 4,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    num_key_value_heads=heads,
    head_dim=hidden // heads,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    bos_token_id=tokenizer.bos_token_id,
    eos_token_id=tokenizer.eos_token_id,
    pad_token_id=tokenizer.pad_token_id,
)
torch.manual_seed(0)
model = LlamaForCausalLM(config)
for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
    setattr(model.generation_config, key, getattr(config, key))
model.save_pretrained(directory)
tokenizer.save_pretrained(directory)
print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters -> {directory}")
EOF

train() {  # train BACKEND [NAME [FLAGS...]]: a run of nemogym-train, then its phase breakdown
  local backend=$1 name=${2:-$1}
  shift $(($# < 2 ? $# : 2))
  say "nemogym-train $name, backend $backend, device $DEVICE: $STEPS steps of $ROWS x 8 rollouts"
  "$PYTHON" -m nemogym_sdk.train --model "$OUT/model" --backend "$backend" \
    --device "$DEVICE" --environments target_chars --steps "$STEPS" --rows-per-step "$ROWS" \
    --num-generations 8 --checkpoint-every "$STEPS" --out "$OUT/$name" "$@"
  say "phase breakdown, $name ($OUT/$name/metrics.jsonl)"
  "$PYTHON" benchmarks/phase_breakdown.py "$OUT/$name" --warmup 1
}

say "4. the transformers backend (nemogym_sdk.serve on $DEVICE)"
train transformers

say "5. the vllm backend (real vLLM behind nemogym_sdk.serve --backend vllm)"
find_vllm='from nemogym_sdk.samplers.vllm import find_vllm_venv; print(find_vllm_venv().root)'
if [[ "${GPU_CHECK_VLLM:-1}" == 0 ]]; then
  echo "skipped (GPU_CHECK_VLLM=0)"
elif "$PYTHON" -c "$find_vllm" 2>/dev/null; then
  train vllm
elif "$PYTHON" -c "import vllm" 2>/dev/null &&
  NEMOGYM_VLLM_VENV=$("$PYTHON" -c 'import sys; print(sys.prefix)') \
    "$PYTHON" -c "$find_vllm" 2>/dev/null; then
  NEMOGYM_VLLM_VENV=$("$PYTHON" -c 'import sys; print(sys.prefix)')
  export NEMOGYM_VLLM_VENV
  train vllm
else
  echo "skipped: no vLLM (no .venv-vllm, no \$NEMOGYM_VLLM_VENV, not importable by $PYTHON)"
fi

say "6. a bfloat16 learner (transformers backend): the mismatch against the sampler"
train transformers bf16 --dtype bfloat16

say "7. torchrun with NCCL, the policy sharded with FSDP2 over every GPU"
gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
if [[ "${GPU_CHECK_NCCL:-1}" == 0 ]]; then
  echo "skipped (GPU_CHECK_NCCL=0)"
elif [[ "$DEVICE" == cpu || "$gpus" -lt 2 ]]; then
  echo "skipped: $gpus GPU(s); NCCL runs one process per GPU, so this needs two or more"
else
  say "nemogym-train under torchrun --nproc_per_node=$gpus --fsdp (NCCL)"
  "$PYTHON" -m torch.distributed.run --nproc_per_node="$gpus" -m nemogym_sdk.train \
    --model "$OUT/model" --device cuda --environments target_chars --steps "$STEPS" \
    --rows-per-step "$gpus" --num-generations 8 --checkpoint-every "$STEPS" --fsdp \
    --out "$OUT/nccl"
  "$PYTHON" benchmarks/phase_breakdown.py "$OUT/nccl" --warmup 1
fi

say "done: everything is under $OUT"
