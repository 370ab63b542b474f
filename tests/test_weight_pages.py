"""Weights copied out of the model file's map (into a repack buffer here; to a GPU, or
with --no-mmap, the same way) do not stay resident in the map as well: the process holds
them once, as llama.cpp does by unmapping such ranges."""
import mmap
import struct

from ggserve.native import ggml
from ggserve.native.gguf_file import GGUFFile


def _resident_file_offsets(path) -> set[int]:
    """File offsets of the pages of `path` mapped into this process and present
    (/proc/self/maps for the map, /proc/self/pagemap's bit 63 for each page)."""
    page, found = mmap.PAGESIZE, set()
    with open("/proc/self/pagemap", "rb") as pagemap:
        for line in open("/proc/self/maps"):
            fields = line.split()
            if len(fields) < 6 or fields[5] != str(path):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            file_offset = int(fields[2], 16)
            pagemap.seek(start // page * 8)
            entries = pagemap.read((end - start) // page * 8)
            for i, (entry,) in enumerate(struct.iter_unpack("Q", entries)):
                if entry >> 63:
                    found.add(file_offset + i * page)
    return found


def test_repacked_weights_leave_the_files_map(gemma3_path):
    f = GGUFFile(gemma3_path)
    q4k = {name for name, t in f.tensors.items() if t.ggml_type == 12}       # GGML_TYPE_Q4_K
    b = ggml.Backend(n_threads=1, use_gpu=False)
    try:
        buffers = b.load_weights(f, {}, repack=q4k)
        repacked = buffers["CPU_REPACK"]
        assert repacked.tensors            # the CPU backend repacked some, reading them through the map
        # Every page the copies were read from is gone from the process. (Pages of the
        # tensors beside them may be mapped: the kernel maps a faulting page's cached
        # neighbours too, and those stay until a graph reads them anyway.)
        page = mmap.PAGESIZE
        copied_pages = set()
        for name in repacked.tensors:
            info = f.tensors[name]
            lo = f.data_offset + info.offset
            hi = lo + info.nbytes
            copied_pages.update(range(-(-lo // page) * page, hi // page * page, page))
        assert len(copied_pages) > 1000
        assert copied_pages.isdisjoint(_resident_file_offsets(gemma3_path))
    finally:
        b.close()
