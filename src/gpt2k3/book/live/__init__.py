"""The live panel's models (book/live.md): chapter 11's trained byte models, their decode step
exported to ONNX for onnxruntime-web, and the accounting the panel shows beside them."""

from gpt2k3.book.live.weights import checkpoint_name, load_model, save_model  # noqa: F401
