"""Build the testbed's tiny Llama: random weights, a locally trained byte-level BPE tokenizer and a
chat template. No hub is reachable from the testbed, so the model is made here, deterministically
(fixed seed, fixed corpus): the same script gives the same files, so the cache key is its hash.

Runs inside the testbed's base image (which has torch, transformers and tokenizers, as vLLM needs
them): `python3 build_tiny_model.py OUT_DIR`. Sizes from shared/real-vllm-cpu.md: hidden 128,
2 layers, 4 heads and 2 KV heads (tensor parallel 2 needs both divisible by 2), vocab 2048, bf16.
"""

from __future__ import annotations

import sys
from pathlib import Path

CORPUS = """\
Two DGX Sparks joined by one QSFP cable serve a large model with tensor parallelism over Ray.
The head runs the Ray head and the API server; the worker joins the cluster at its control address.
Each node runs one container with the same image, the same flags and the same forwarded variables.
A healthy pair answers every request, reports its metrics and keeps its memory headroom.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Hello! How are you today? I am fine, thank you. What is the capital of France? Paris.
One, two, three, four, five, six, seven, eight, nine, ten. The answer is forty-two.
"""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def tokenizer(texts, vocab_size: int = 2048):
    """A byte-level BPE tokenizer trained on `texts`, with the chat template (a transformers fast one)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def config(fast):
    """The tiny Llama's shape (the module's docstring says why these sizes)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=2048,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )


def save(model, fast, out: Path) -> None:
    """The model in bf16 as safetensors, and its tokenizer, as save_pretrained writes them."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    gen = out / "generation_config.json"
    if gen.exists():
        gen.unlink()  # a default one adds nothing; fewer files, same model


def build(out: Path) -> None:
    import torch
    from transformers import LlamaForCausalLM

    fast = tokenizer([CORPUS] * 50)
    torch.manual_seed(0)
    save(LlamaForCausalLM(config(fast)), fast, out)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
