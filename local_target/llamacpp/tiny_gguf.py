"""A tiny random-weight Llama as one GGUF file, written offline with the ``gguf`` package (no model hub).

The tokenizer is byte-level BPE (GPT-2's byte alphabet) with a fixed list of merges of frequent English letter
pairs, ChatML control tokens and a ChatML chat template, so that llama-server's ``/v1/chat/completions``,
``/tokenize`` and ``/apply-template`` work. The weights are noise from a fixed seed: the model emits random
tokens (output lengths are forced with ``ignore_eos``), and what it costs to run is the point — its prefill
and decode times are those of a real transformer of this shape on this CPU. Its output layer only ever ranks
ASCII bytes and merges among the top 40: a byte >= 0x80 is part of a character, and llama-server holds an
incomplete character back until it is whole, so a random model delivered several tokens late in one chunk
(victims' gaps grew by whole prefill slices); a token now arrives when it is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
                 "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                 "{% endif %}")
# merges of frequent pairs, so that text is not all single bytes (each merged pair is one more token)
MERGE_PAIRS = ["t h", "Ġ t", "h e", "i n", "e r", "a n", "r e", "o n", "Ġ a", "e n", "a t", "o r", "e s", "Ġ s",
               "e d", "i s", "Ġ o", "i t", "a l", "a r", "Ġ w", "Ġ c", "Ġ b", "Ġ f", "Ġ p", "Ġ m", "o u", "l e"]


OUTPUT_GAIN = 50.0  # output rows × this: logit std ≈ 0.02 · √512 · 50 ≈ 22 against the silent rows' 0
FORMAT_VERSION = 2  # 2: never emits a partial UTF-8 character (see the module's docstring)


@dataclass(frozen=True)
class GgufShape:
    hidden_size: int = 512
    intermediate_size: int = 1408
    num_hidden_layers: int = 6
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    context_length: int = 16384
    seed: int = 0


class MissingDependency(RuntimeError):
    """gguf / numpy are not installed (they come with the llamacpp extra)."""


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each of the 256 bytes, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): specials (control), the byte alphabet, then one token per merge."""
    tokens = SPECIALS + byte_alphabet() + [p.replace(" ", "") for p in MERGE_PAIRS]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))  # 3 control, 1 normal
    return tokens, types, list(MERGE_PAIRS)


def write_tiny_gguf(path: Path, shape: GgufShape = GgufShape()) -> dict[str, int]:
    """Write the model to ``path`` (created or replaced); returns its parameter count and vocabulary size."""
    try:
        import numpy as np
        from gguf import GGUFWriter
    except ImportError as exc:
        raise MissingDependency(f"{exc.name} is missing: pip install 'loadgen[llamacpp]'") from exc
    tokens, types, merges = vocabulary()
    n_vocab, d, ff = len(tokens), shape.hidden_size, shape.intermediate_size
    head_dim = d // shape.num_attention_heads
    kv = head_dim * shape.num_key_value_heads
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), "llama")
    w.add_name("loadgen-tiny-llama")
    w.add_context_length(shape.context_length)
    w.add_embedding_length(d)
    w.add_block_count(shape.num_hidden_layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(shape.num_attention_heads)
    w.add_head_count_kv(shape.num_key_value_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)  # all F32
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(shape.seed)
    high_bytes = set(byte_alphabet()[0x80:])  # pieces of multi-byte characters
    silent = np.array([i for i, t in enumerate(tokens) if i < len(SPECIALS) or t in high_bytes])

    def tensor(name: str, *dims: int, norm: bool = False, silent_rows: "np.ndarray | None" = None) -> int:
        data = np.ones(dims, np.float32) if norm else (rng.standard_normal(dims) * 0.02).astype(np.float32)
        if silent_rows is not None:  # logits: these 0, the others ~N(0, 22²), so ~80 of them rank above
            data *= OUTPUT_GAIN
            data[silent_rows] = 0.0
        w.add_tensor(name, data)
        return data.size

    params = tensor("token_embd.weight", n_vocab, d) + tensor("output_norm.weight", d, norm=True)
    params += tensor("output.weight", n_vocab, d, silent_rows=silent)
    for i in range(shape.num_hidden_layers):
        b = f"blk.{i}."
        params += tensor(b + "attn_norm.weight", d, norm=True) + tensor(b + "ffn_norm.weight", d, norm=True)
        params += tensor(b + "attn_q.weight", d, d) + tensor(b + "attn_k.weight", kv, d)
        params += tensor(b + "attn_v.weight", kv, d) + tensor(b + "attn_output.weight", d, d)
        params += tensor(b + "ffn_gate.weight", ff, d) + tensor(b + "ffn_up.weight", ff, d)
        params += tensor(b + "ffn_down.weight", d, ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"parameters": params, "vocab_size": n_vocab}
