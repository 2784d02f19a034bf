"""The small random-weight Llama of test_transformers.py and examples: built from a config
with a fixed seed (no download), and the prompts it is given."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 256


def build_model(seed=1234):
    """The same weights in every process: a 2-layer Llama, 2 KV heads of 16 dims, fp32."""
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
                      eos_token_id=2)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def prompt(n, seed):
    """n token ids of a seeded generator, shape [1, n]."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (1, n), generator=g)


def system_prompt():
    return prompt(37, 7)


def user_prompt(seed=11, n=11):
    """The system prompt and a user turn of its own after it."""
    return torch.cat([system_prompt(), prompt(n, seed)], dim=1)
