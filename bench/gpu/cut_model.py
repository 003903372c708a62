"""Cut a GGUF llama model to its first N layers, re-quantising the token embedding, so that the
model fits the 64 MiB a call to the lent GPU machine can carry (SmolLM2-135M Q4_1 is 97 MB).

Run (needs the ``gguf`` package, e.g. ``pip install gguf==0.19.0`` in a scratch venv):
    python bench/gpu/cut_model.py SRC.gguf OUT.gguf --layers 8

The kept layers are the model's own weights, byte for byte; the embedding goes from Q8_0 to
Q4_1. The result speaks and tokenises like the model (same vocabulary and chat template) but
its words are poor: it is a stand-in for a fast server in a throughput benchmark, where what is
measured is whether the daemon keeps up with the server, not what the model says.
"""

from __future__ import annotations

import argparse
import re

import numpy as np  # type: ignore[import-not-found,unused-ignore]
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter  # type: ignore[import-not-found]
from gguf.quants import dequantize, quantize  # type: ignore[import-not-found]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    r = GGUFReader(args.src)
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    w = GGUFWriter(args.out, arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        if key == f"{arch}.block_count":
            w.add_uint32(key, args.layers)
        elif vtype == GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == GGUFValueType.STRING:
                vals: list[object] = [str(bytes(field.parts[i]), "utf-8") for i in field.data]
            else:
                vals = [field.parts[i].tolist()[0] for i in field.data]
            w.add_array(key, vals)
        elif vtype == GGUFValueType.STRING:
            w.add_string(key, str(bytes(field.parts[-1]), "utf-8"))
        else:
            w.add_key_value(key, field.parts[-1].tolist()[0], vtype)
    keep = re.compile(r"blk\.(\d+)\.")
    for t in r.tensors:
        m = keep.match(t.name)
        if m and int(m.group(1)) >= args.layers:
            continue
        qtype = GGMLQuantizationType(t.tensor_type)
        data = np.asarray(t.data)
        if t.name == "token_embd.weight" and qtype == GGMLQuantizationType.Q8_0:
            floats = dequantize(data, qtype)
            qtype, data = GGMLQuantizationType.Q4_1, quantize(floats, GGMLQuantizationType.Q4_1)
        w.add_tensor(t.name, data, raw_dtype=qtype)  # a quantised one's shape is in bytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
