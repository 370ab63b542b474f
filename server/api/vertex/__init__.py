"""Vertex AI's custom-container protocol (AIP_MODE=PREDICTION)."""
