"""The small-scale Ariadne training study (docs/study.md): procedural images with exact masks
(data), a Qwen2.5-VL-style ViT whose attention is ariadne's op (model), checkpoints in the layout
ariadne's encoder reads (checkpoint) and the training loop (train; `python -m ariadne.study`).
Needs torch."""
