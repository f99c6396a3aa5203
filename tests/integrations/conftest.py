"""Integration tests run offline: nothing may reach the Hugging Face Hub."""

from __future__ import annotations

import os

# Read by huggingface_hub when it is first imported, so it is set before any test module loads.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
