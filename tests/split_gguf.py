"""Split a GGUF file into parts as llama.cpp's tools do (`<stem>-00001-of-0000N.gguf`).

gguf-py's GGUFWriter splits by tensor count (`split_max_tensors`, what llama.cpp's converter's
--split-max-tensors uses): the first part keeps the metadata, every part its own tensors, and each
carries split.no / split.count / split.tensors.count. Here an existing file is read back with
gguf.GGUFReader and written again through such a writer.
"""

from __future__ import annotations

from pathlib import Path

import gguf
from gguf import GGUFValueType


def write_split_gguf(source: Path, folder: Path, max_tensors: int) -> list[Path]:
    """`source` as parts of at most `max_tensors` tensors in `folder` (made if need be),
    named after it."""
    folder.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(folder / source.name, arch, split_max_tensors=max_tensors)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the header's own fields; the writer adds the architecture itself
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub_type)
    for tensor in reader.tensors:
        writer.add_tensor(
            tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(folder.glob(f"{source.stem}-*-of-*.gguf"))
