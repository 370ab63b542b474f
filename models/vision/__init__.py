"""Vision: llama.cpp mmproj files -> image tiles -> embeddings for the text model.

    vm = VisionModel.from_gguf(path, backend)
    tiles = vm.preprocess(pil_image)          # float32 CHW tiles (+ grid_x, grid_y)
    rows = [vm.encode(t) for t in tiles]      # each float32 [n_tokens, vm.n_embd_out]
"""
from ggserve.models.vision.encoder import VisionModel
from ggserve.models.vision.mmproj import PROJECTORS, VisionConfig, open_mmproj
from ggserve.models.vision.preprocess import Tiles, to_rgb

__all__ = ["VisionModel", "VisionConfig", "PROJECTORS", "Tiles", "open_mmproj", "to_rgb"]
