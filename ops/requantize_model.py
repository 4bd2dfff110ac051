#!/usr/bin/env python3
"""Re-quantize a GGUF model's Q4_1 weight tensors to Q4_0.

ggml's CPU backend repacks Q4_0 weights into interleaved blocks for its AVX2 matrix
kernels; Q4_1 has no such path. This writes SmolLM2 with Q4_0 weights so the speed
of both can be measured side by side (`ops/bench --model-q4-0`). Every other tensor and
every metadata key is copied as is, except general.file_type.

    python3 ops/requantize_model.py SOURCE.gguf OUTPUT.gguf

Q4_1 -> f32 -> Q4_0 adds a second rounding: the output is a lower-quality model than a
Q4_0 made from the original weights. It is for measuring kernels, not for quality.
"""

import os
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__" and sys.argv[1:2] in (["-h"], ["--help"]):
    print(__doc__.strip())
    sys.exit(0)

from make_tiny_model import field_value  # noqa: E402


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    import gguf
    import numpy as np
    from gguf import quants

    source, output = Path(sys.argv[1]), Path(sys.argv[2])
    reader = gguf.GGUFReader(str(source))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".part", dir=output.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    converted = 0
    try:
        writer = gguf.GGUFWriter(str(tmp), arch)
        for name, field in reader.fields.items():
            if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
                continue
            writer.add_key_value(name, *field_value(gguf, field))
        writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_0))
        Q = gguf.GGMLQuantizationType
        for t in reader.tensors:
            # ggml's ne is the reverse of numpy's shape.
            shape = [int(n) for n in reversed(t.shape)]
            if t.tensor_type == Q.Q4_1:
                f32 = quants.dequantize(t.data, Q.Q4_1).reshape(shape)
                data = quants.quantize(f32.astype(np.float32), Q.Q4_0)
                writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=Q.Q4_0)
                converted += 1
            else:
                writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, output)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    print(f"requantize: {converted} Q4_1 tensors to Q4_0 -> {output}", file=sys.stderr)
    print(output)


if __name__ == "__main__":
    main()
