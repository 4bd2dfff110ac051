#!/usr/bin/env python3
"""Reference all-MiniLM-L6-v2 embeddings from the original safetensors, in plain numpy.

tests/memory/embedder.rs checks the converted GGUF against these vectors. The check is only worth
something if it shares no code with the converter or llama.cpp, so this file has its own
safetensors reader, its own BERT WordPiece tokenizer (HF BertTokenizer rules: clean text,
lowercase, strip accents, split punctuation and CJK, greedy longest-match WordPiece) and
its own float32 forward pass (post-LN BERT, exact erf GELU, mean pooling over all tokens,
not normalised: cosine does not care).

Usage: minilm_reference.py MODEL_DIR OUTPUT.json
Writes {"model": ..., "safetensors_sha256": ..., "cases": [{"text", "token_ids", "embedding"}]}.
"""

import hashlib
import json
import math
import os
import struct
import sys
import unicodedata

if __name__ == "__main__" and sys.argv[1:2] in (["-h"], ["--help"]):
    print(__doc__.strip())
    sys.exit(0)

import numpy as np  # noqa: E402

# Sentences the Rust test embeds with llama.cpp and compares against. Mixed case, accents,
# punctuation and a word split into pieces exercise the tokenizer as well as the weights.
SENTENCES = [
    "The cat sits on the mat",
    "A kitten is resting on a rug",
    "Quarterly tax filing deadlines",
    "My sister Priya lives in Lisbon and works as a nurse.",
    "Café owners in São Paulo don't open before 9am!",
    "Unbelievably, the hyperparameter search finished overnight.",
]


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        blob = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            continue
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(blob[a:b], dtype=np.float32).reshape(info["shape"])
    return out


def is_punct(ch):
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def is_cjk(cp):
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def basic_tokens(text):
    cleaned = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD:
            continue
        if ch in "\t\n\r" or unicodedata.category(ch) == "Zs":
            cleaned.append(" ")
        elif unicodedata.category(ch).startswith("C"):
            continue
        elif is_cjk(cp):
            cleaned.append(f" {ch} ")
        else:
            cleaned.append(ch)
    text = "".join(cleaned).lower()
    text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    words = []
    for word in text.split():
        cur = ""
        for ch in word:
            if is_punct(ch):
                if cur:
                    words.append(cur)
                    cur = ""
                words.append(ch)
            else:
                cur += ch
        if cur:
            words.append(cur)
    return words


def wordpiece(words, vocab):
    ids = []
    for word in words:
        if len(word) > 100:
            ids.append(vocab["[UNK]"])
            continue
        pieces, start, bad = [], 0, False
        while start < len(word):
            end, found = len(word), None
            while start < end:
                sub = word[start:end] if start == 0 else "##" + word[start:end]
                if sub in vocab:
                    found = vocab[sub]
                    break
                end -= 1
            if found is None:
                bad = True
                break
            pieces.append(found)
            start = end
        ids.extend([vocab["[UNK]"]] if bad else pieces)
    return ids


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x):
    return (0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))).astype(np.float32)


def forward(ids, t, cfg):
    eps = cfg["layer_norm_eps"]
    heads = cfg["num_attention_heads"]
    n = len(ids)
    x = (
        t["embeddings.word_embeddings.weight"][ids]
        + t["embeddings.position_embeddings.weight"][:n]
        + t["embeddings.token_type_embeddings.weight"][0]
    )
    x = layer_norm(x, t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"], eps)
    d = x.shape[1]
    hd = d // heads

    def lin(h, p):
        return h @ t[p + ".weight"].T + t[p + ".bias"]

    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q = lin(x, p + "attention.self.query").reshape(n, heads, hd).transpose(1, 0, 2)
        k = lin(x, p + "attention.self.key").reshape(n, heads, hd).transpose(1, 0, 2)
        v = lin(x, p + "attention.self.value").reshape(n, heads, hd).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
        s = np.exp(s - s.max(-1, keepdims=True))
        s = s / s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(n, d)
        x = layer_norm(
            lin(a, p + "attention.output.dense") + x,
            t[p + "attention.output.LayerNorm.weight"],
            t[p + "attention.output.LayerNorm.bias"],
            eps,
        )
        h = gelu(lin(x, p + "intermediate.dense"))
        x = layer_norm(
            lin(h, p + "output.dense") + x,
            t[p + "output.LayerNorm.weight"],
            t[p + "output.LayerNorm.bias"],
            eps,
        )
    return x.mean(0)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: minilm_reference.py MODEL_DIR OUTPUT.json")
    model_dir, out = sys.argv[1], sys.argv[2]
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(model_dir, "vocab.txt"), encoding="utf-8") as f:
        vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
    st_path = os.path.join(model_dir, "model.safetensors")
    with open(st_path, "rb") as f:
        st_sha = hashlib.sha256(f.read()).hexdigest()
    t = read_safetensors(st_path)
    cases = []
    for text in SENTENCES:
        ids = [vocab["[CLS]"]] + wordpiece(basic_tokens(text), vocab) + [vocab["[SEP]"]]
        emb = forward(ids, t, cfg)
        cases.append({"text": text, "token_ids": ids, "embedding": [float(v) for v in emb]})
    doc = {"model": "sentence-transformers/all-MiniLM-L6-v2", "safetensors_sha256": st_sha, "cases": cases}
    tmp = out + ".part"
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.write("\n")
    os.replace(tmp, out)
    print(f"minilm_reference: wrote {len(cases)} reference vectors to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
