#!/usr/bin/env python3
"""Writes a llama-architecture GGUF with random weights: a real model's shape
at small scale (grouped-query attention 8:1 and head dimension 128, as in
Llama-3 70B), for cxltier-llama's tests. Nothing is downloaded: the weights
are seeded random numbers and the vocabulary is SentencePiece byte fallback
(the three specials, the word-start mark and the 256 bytes), so any text
tokenizes and any prompt runs.

    python3 tools/llama/make_model.py --out build/llama/tiny.gguf

The defaults: 4 layers, 8 query heads and 1 KV head of dimension 128
(n_embd 1024), feed-forward 2816, f16 weights: about 90 MB. A KV block of 16
tokens is then 16 x 4 layers x 1 KV head x 128 x 2 (K and V) x 2 bytes =
32 KiB. Needs python3-gguf and python3-numpy (Debian forky's).
"""
import argparse

import numpy as np

import gguf


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the .gguf to write")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8, help="query heads")
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--ff", type=int, default=2816, help="feed-forward width")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.heads % args.kv_heads:
        ap.error("--heads must be a multiple of --kv-heads")

    n_embd = args.heads * args.head_dim
    n_kv = args.kv_heads * args.head_dim
    # SentencePiece with byte fallback: unknown, begin, end, the word-start
    # mark, then one token per byte. Every string is distinct (a duplicate
    # aborts llama.cpp's load).
    tokens = ["<unk>", "<s>", "</s>", "\u2581"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL,
             gguf.TokenType.NORMAL] + [gguf.TokenType.BYTE] * 256
    scores = [0.0] * len(tokens)
    assert len(set(tokens)) == len(tokens)
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name("cxltier-tiny-gqa")
    w.add_context_length(args.context)
    w.add_embedding_length(n_embd)
    w.add_block_count(args.layers)
    w.add_feed_forward_length(args.ff)
    w.add_head_count(args.heads)
    w.add_head_count_kv(args.kv_heads)
    w.add_rope_dimension_count(args.head_dim)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    rng = np.random.default_rng(args.seed)

    def mat(rows, cols):  # rows = outputs; scaled so activations stay near 1
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)

    def norm(n):
        return np.ones(n, dtype=np.float32)

    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd))
    for i in range(args.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(n_embd))
        w.add_tensor(p + "attn_q.weight", mat(n_embd, n_embd))
        w.add_tensor(p + "attn_k.weight", mat(n_kv, n_embd))
        w.add_tensor(p + "attn_v.weight", mat(n_kv, n_embd))
        w.add_tensor(p + "attn_output.weight", mat(n_embd, n_embd))
        w.add_tensor(p + "ffn_norm.weight", norm(n_embd))
        w.add_tensor(p + "ffn_gate.weight", mat(args.ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(args.ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(n_embd, args.ff))
    w.add_tensor("output_norm.weight", norm(n_embd))
    w.add_tensor("output.weight", mat(n_vocab, n_embd))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
