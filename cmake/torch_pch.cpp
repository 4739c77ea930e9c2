// Translation unit that carries the precompiled <torch/torch.h> shared by all LibTorch targets.
