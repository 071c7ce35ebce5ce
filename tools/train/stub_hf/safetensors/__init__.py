"""Stand-in for the safetensors package (see ../README.md): only safetensors.numpy.save_file."""
__version__ = "stub"
