#!/usr/bin/env python3
"""Writes the hand-made LLKV1 regression files (README.md here says what each shows).
Run from anywhere: python3 fuzz/regressions/make_llkv.py"""
import itertools
import os

os.chdir(os.path.dirname(os.path.abspath(__file__)))


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283

ORDER = ["format_version", "model_sha", "digest_version", "crc32c", "tokens", "bytes",
         "stored_bytes", "timestamp", "llama_build", "n_ctx", "type_k", "type_v",
         "compression", "scope", "turn_id", "segments"]
BASE = {"format_version": b"1", "model_sha": b"ab" * 32, "digest_version": b"",
        "tokens": b"0", "bytes": b"0", "stored_bytes": b"0", "timestamp": b"1700000000",
        "llama_build": b"b6500", "n_ctx": b"4096", "type_k": b"f16", "type_v": b"f16",
        "compression": b"none", "scope": b"00" * 16, "turn_id": b"1", "segments": b""}


def llkv(body, **fields):
    f = dict(BASE, **fields, crc32c=str(crc32c(body)).encode())
    text = b"LLKV1\n" + b"".join(k.encode() + b"=" + f[k] + b"\n" for k in ORDER)
    return text + b"header_crc32c=%d\n\n" % crc32c(text) + body


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as out:
        out.write(data)


# zstd-capacity: 347 bytes whose header claims 4 GiB of zstd state (the worker's limit at
# N_CTX=4096): decode reserves 4 GiB before zstd sees the 1-byte payload.
write("llkv_decode/zstd-capacity-4GiB",
      llkv(b"\x00", compression=b"zstd", bytes=b"4294967296", stored_bytes=b"1"))

# cr-value: a valid file whose model_sha line is "ab\r\r\n": decode gives "ab\r", which
# encode writes as "ab\r\n" and decode then reads as "ab".
tokens = (7).to_bytes(4, "little") + (9).to_bytes(4, "little")
write("llkv_decode/cr-value",
      llkv(tokens + bytes(range(16)), model_sha=b"ab\r\r", tokens=b"2", bytes=b"16",
           stored_bytes=b"16", segments=b"B:2"))

# quadratic-keys: a 64 KB header of 14,865 distinct one- to three-character keys with a
# correct header CRC: the duplicate-key scan does ~110 million comparisons.
chars = [chr(c) for c in range(0x21, 0x7F) if chr(c) != "="]
lines, size = [], 6
for n in (1, 2, 3):
    for k in itertools.product(chars, repeat=n):
        line = ("".join(k) + "=\n").encode()
        if size + len(line) > 65536 - 40:
            break
        lines.append(line)
        size += len(line)
    else:
        continue
    break
text = b"LLKV1\n" + b"".join(lines)
write("llkv_header/quadratic-keys", text + b"header_crc32c=%d\n\n" % crc32c(text))
