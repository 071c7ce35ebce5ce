"""safetensors.numpy.save_file through tools/fixtures/awq_pack.py's writer (stand-in)."""
import awq_pack as AP

_DT = {"float32": "F32", "float16": "F16", "int32": "I32"}


def save_file(tensors, path, metadata=None):
    AP.write_safetensors(path, [(k, AP.T(_DT[str(v.dtype)], v)) for k, v in tensors.items()], metadata)
