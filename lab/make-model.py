#!/usr/bin/env python3
"""Writes a tiny llama-architecture GGUF model for `redstring-sim lab`.

A lab run needs a real llama.cpp server whose answers, speed and loading time
are known in advance, without downloading a model. The weights here are chosen,
not trained: every layer's output projections are zero, so the residual stream
is the token's embedding and the logits are a fixed ranking of the vocabulary.
Under a JSON-schema grammar that ranking writes the shortest valid object
(end of text first, then the quote that closes a string, then the brace that
closes an object), so each answer parses and takes a known number of tokens.
`--slow` ranks a letter above the closing quote, so every answer runs to
`max_tokens`. The layers still cost their matrix products, so `--dims` and
`--layers` set the time per token and the file's size sets the load time.

    python3 lab/make-model.py OUT.gguf [--dims 256] [--layers 4] [--slow]

Needs the `gguf` and `numpy` packages (`python3 -m pip install gguf numpy`).
"""
import argparse

import gguf
import numpy as np


def vocabulary():
    """A SentencePiece-style vocabulary: the three control tokens, the 256
    byte tokens, then one piece per printable ASCII character."""
    tokens, types = ["<unk>", "<s>", "</s>"], [
        gguf.TokenType.UNKNOWN,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
    ]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(gguf.TokenType.BYTE)
    for c in range(32, 127):
        tokens.append("\u2581" if c == 32 else chr(c))
        types.append(gguf.TokenType.NORMAL)
    return tokens, types


def ranking(tokens, slow):
    """One logit per token: end of text, then the characters that end a JSON
    value soonest, then the rest by character (control and byte tokens last)."""
    first = ["a"] if slow else []
    first += ['"', "}", "0", "]", ",", ":", "1", "{", "["]
    logits = np.full(len(tokens), -20.0, dtype=np.float32)
    for i, t in enumerate(tokens):
        if len(t) == 1:
            logits[i] = -10.0 - (ord(t) % 7) * 0.1
    logits[2] = 40.0  # </s>
    for rank, piece in enumerate(first):
        logits[tokens.index(piece)] = 30.0 - 2.0 * rank
    return logits


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--dims", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--slow", action="store_true")
    args = parser.parse_args()
    d, layers, heads = args.dims, args.layers, args.heads
    if d <= 0 or layers < 0 or heads <= 0 or d % heads or (d // heads) % 2:
        parser.error("dims must be a positive multiple of 2 × heads")
    ffn = 2 * d

    tokens, types = vocabulary()
    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name("redstring-lab")
    w.add_context_length(4096)
    w.add_embedding_length(d)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(d // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )

    rng = np.random.default_rng(1)
    # Every token embeds to the same direction, so the final norm gives the
    # same vector whatever the input, and each logit is its output row's sum.
    w.add_tensor("token_embd.weight", np.ones((len(tokens), d), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    out = np.repeat(ranking(tokens, args.slow)[:, None] / d, d, axis=1)
    w.add_tensor("output.weight", out.astype(np.float32))
    small = lambda *shape: (rng.standard_normal(shape) * 0.02).astype(np.float32)
    zero = lambda *shape: np.zeros(shape, dtype=np.float32)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", small(d, d))
        w.add_tensor(f"blk.{i}.attn_k.weight", small(d, d))
        w.add_tensor(f"blk.{i}.attn_v.weight", small(d, d))
        w.add_tensor(f"blk.{i}.attn_output.weight", zero(d, d))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(d, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", small(ffn, d))
        w.add_tensor(f"blk.{i}.ffn_up.weight", small(ffn, d))
        w.add_tensor(f"blk.{i}.ffn_down.weight", zero(d, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
