#!/usr/bin/env python3
"""Generate a tiny random-weight llama-architecture GGUF for fast kvmem tests.

The tokenizer (all ``tokenizer.ggml.*`` keys) and the chat template
(``tokenizer.chat_template``) are copied verbatim from the SmolLM2 GGUF, so the
tiny model tokenizes and formats chats exactly like the real one, while its
weights are random (numpy ``RandomState`` with a fixed seed).

Output is deterministic: the same seed and source GGUF give a byte-identical
file. Use ``--seed N`` to produce a different model (different sha256), e.g.
to simulate a model change in tests.

Usually invoked through the ``ops/make-tiny-model`` wrapper, which installs the
``gguf`` and ``numpy`` packages if they are missing.

Only the final output path is printed on stdout (last line); logs go to stderr.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_SEED = 0
DEFAULT_NAME = "tiny-random-llama.gguf"

# Architecture of the tiny model.
N_LAYERS = 2
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = N_EMBD // N_HEAD  # 16
N_FF = 128
N_CTX = 4096
ROPE_FREQ_BASE = 10000.0
RMS_EPS = 1e-5
WEIGHT_STD = 0.02

OPS_DIR = Path(__file__).resolve().parent


def log(msg: str) -> None:
    print(f"make-tiny-model: {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> "None":
    print(f"make-tiny-model: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def models_dir() -> Path:
    env = os.environ.get("KVMEM_MODELS_DIR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "kvmem" / "models"


def default_output(seed: int) -> Path:
    if seed == DEFAULT_SEED:
        name = DEFAULT_NAME
    else:
        name = f"tiny-random-llama-seed{seed}.gguf"
    return models_dir() / name


def fetch_smollm2() -> Path:
    """Run ops/fetch-model and return the path it prints as its last stdout line."""
    script = OPS_DIR / "fetch-model"
    log(f"no --source given; running {script}")
    try:
        res = subprocess.run([str(script)], check=True, stdout=subprocess.PIPE, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        die(f"{script} failed: {e}")
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    if not lines:
        die(f"{script} printed no path")
    return Path(lines[-1].strip())


def field_value(gguf, field):
    """Decode a GGUFReader field into a value GGUFWriter.add_key_value accepts.

    Returns (value, vtype, sub_type). Strings are kept as raw bytes so they
    round-trip byte-for-byte (the writer accepts bytes for STRING values).
    """
    VT = gguf.GGUFValueType
    vtype = VT(field.types[0])

    def scalar(part, t):
        if t == VT.STRING:
            return bytes(part)
        v = part[0].item()
        if t == VT.BOOL:
            return bool(v)
        return v

    if vtype == VT.ARRAY:
        if len(field.types) != 2:
            raise ValueError(f"{field.name}: nested arrays are not supported")
        sub = VT(field.types[1])
        return [scalar(field.parts[i], sub) for i in field.data], vtype, sub
    return scalar(field.parts[field.data[0]], vtype), vtype, None


def build(source: Path, output: Path, seed: int) -> None:
    try:
        import gguf
        import numpy as np
    except ImportError as e:
        die(f"{e}; install with: pip install --quiet gguf numpy (or use ops/make-tiny-model)")
    if not hasattr(gguf.GGUFWriter, "add_key_value"):
        die("installed gguf package is too old (no GGUFWriter.add_key_value); pip install -U gguf")

    log(f"reading tokenizer from {source}")
    reader = gguf.GGUFReader(str(source))
    copied = []
    for name, field in reader.fields.items():
        if name.startswith("tokenizer.ggml.") or name == "tokenizer.chat_template":
            copied.append((name, *field_value(gguf, field)))
    keys = {c[0] for c in copied}
    for required in ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.chat_template"):
        if required not in keys:
            die(f"{source} has no {required}")
    n_vocab = len(next(c[1] for c in copied if c[0] == "tokenizer.ggml.tokens"))
    log(f"vocab size {n_vocab}, copying {len(copied)} tokenizer keys")

    rng = np.random.RandomState(seed)

    def w(*shape):  # numpy shape; ggml ne is the reverse
        return (rng.standard_normal(shape) * WEIGHT_STD).astype(np.float16)

    def ones(n):
        return np.ones((n,), dtype=np.float32)

    n_embd_kv = N_HEAD_KV * HEAD_DIM
    # Generation order is fixed so the RNG stream (and thus the file) is deterministic.
    tensors = [("token_embd.weight", w(n_vocab, N_EMBD))]
    for i in range(N_LAYERS):
        tensors += [
            (f"blk.{i}.attn_norm.weight", ones(N_EMBD)),
            (f"blk.{i}.attn_q.weight", w(N_EMBD, N_EMBD)),
            (f"blk.{i}.attn_k.weight", w(n_embd_kv, N_EMBD)),
            (f"blk.{i}.attn_v.weight", w(n_embd_kv, N_EMBD)),
            (f"blk.{i}.attn_output.weight", w(N_EMBD, N_EMBD)),
            (f"blk.{i}.ffn_norm.weight", ones(N_EMBD)),
            (f"blk.{i}.ffn_gate.weight", w(N_FF, N_EMBD)),
            (f"blk.{i}.ffn_up.weight", w(N_FF, N_EMBD)),
            (f"blk.{i}.ffn_down.weight", w(N_EMBD, N_FF)),
        ]
    tensors += [
        ("output_norm.weight", ones(N_EMBD)),
        ("output.weight", w(n_vocab, N_EMBD)),
    ]

    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".part", dir=output.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(str(tmp), "llama")
        writer.add_type("model")
        writer.add_name(f"tiny-random-llama seed {seed}")
        writer.add_description(
            "kvmem test model: random weights, SmolLM2-135M-Instruct tokenizer and chat template"
        )
        writer.add_uint32("kvmem.tiny_model.seed", seed)
        writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
        writer.add_vocab_size(n_vocab)
        writer.add_context_length(N_CTX)
        writer.add_embedding_length(N_EMBD)
        writer.add_block_count(N_LAYERS)
        writer.add_feed_forward_length(N_FF)
        writer.add_head_count(N_HEAD)
        writer.add_head_count_kv(N_HEAD_KV)
        writer.add_rope_dimension_count(HEAD_DIM)
        writer.add_rope_freq_base(ROPE_FREQ_BASE)
        writer.add_layer_norm_rms_eps(RMS_EPS)
        for name, value, vtype, sub in copied:
            writer.add_key_value(name, value, vtype, sub)
        for name, arr in tensors:
            writer.add_tensor(name, arr)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, output)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    log(f"wrote {output} ({output.stat().st_size} bytes)")


def main() -> None:
    p = argparse.ArgumentParser(
        prog="make-tiny-model",
        description="Make a tiny random-weight llama GGUF with SmolLM2's tokenizer and chat template.",
    )
    p.add_argument(
        "output",
        nargs="?",
        type=Path,
        help="output path (default: $KVMEM_MODELS_DIR or ~/.cache/kvmem/models, "
        f"file {DEFAULT_NAME}, or tiny-random-llama-seedN.gguf when --seed is not {DEFAULT_SEED})",
    )
    p.add_argument(
        "--source",
        type=Path,
        help="SmolLM2 GGUF to copy the tokenizer/chat template from (default: run ops/fetch-model)",
    )
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"RNG seed (default: {DEFAULT_SEED})")
    p.add_argument("--force", action="store_true", help="regenerate even if the output exists")
    args = p.parse_args()

    if not 0 <= args.seed < 2**32:
        die("--seed must be in [0, 2^32)")
    output = args.output if args.output is not None else default_output(args.seed)

    if output.exists() and not args.force:
        log(f"{output} exists, skipping (use --force to regenerate)")
    else:
        source = args.source if args.source is not None else fetch_smollm2()
        if not source.is_file():
            die(f"source GGUF {source} not found")
        build(source, output, args.seed)
    print(output, flush=True)


if __name__ == "__main__":
    main()
