"""Audio input as llama.cpp's mtmd takes it: decoding (decode.py), the log-mel front
ends (mel.py), and the audio encoders and projectors of mmproj files (model.py and one
module per family)."""
