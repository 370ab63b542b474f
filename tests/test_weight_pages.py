"""Weights copied out of the model file's map (into a repack buffer here; to a GPU, or
with --no-mmap, the same way) do not stay resident in the map as well: the process holds
them once, as llama.cpp does by unmapping such ranges."""
from ggserve.native import ggml
from ggserve.native.gguf_file import GGUFFile


def _map_rss_kib(path: str) -> int:
    """Resident KiB of this process's maps of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        if line[0] in "0123456789abcdef" and " " in line and "-" in line.split()[0]:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_repacked_weights_leave_the_files_map(gemma3_path):
    f = GGUFFile(gemma3_path)
    q4k = {name for name, t in f.tensors.items() if t.ggml_type == 12}       # GGML_TYPE_Q4_K
    b = ggml.Backend(n_threads=1, use_gpu=False)
    try:
        buffers = b.load_weights(f, {}, repack=q4k)
        repacked = buffers["CPU_REPACK"]
        assert repacked.tensors            # the CPU backend repacked some, reading them through the map
        # what stays mapped is not touched until a graph reads it; the copied pages are gone
        assert _map_rss_kib(gemma3_path) < 1024
    finally:
        b.close()
