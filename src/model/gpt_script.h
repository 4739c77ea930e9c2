// The built-in GPT as a TorchScript module: the same computation written in TorchScript source
// (torch::jit::Module::define) around copies of a Gpt's weights, so `torch.jit.load(path)` in
// PyTorch gives a model that computes what ours computes, with no Gossamer code.
//
// Layout of the module (its state_dict names): wte, wpe (token and position embeddings); block_0 ..
// block_{L-1}, each holding ln1_weight, ln1_bias, qkv_weight, qkv_bias, proj_weight, proj_bias,
// ln2_weight, ln2_bias, fc_weight, fc_bias, mlp_proj_weight, mlp_proj_bias and its causal mask as
// a buffer; ln_f_weight, ln_f_bias. The head is tied to wte. forward(tokens int64 [B, T]) returns
// logits [B, T, vocab]. Dropout is left out: the module is for inference and further training
// without it. Trained again by Gossamer (model.kind = torchscript), the names cut into the same
// blocks as the GPT's with the default model.block_pattern.
//
// Threading: pure with respect to the Gpt (which it only reads). Errors: LibTorch's, thrown
// (c10::Error) only on a bug in the generated source.
#pragma once

#include <torch/script.h>

#include "model/gpt.h"

namespace gossamer::model {

torch::jit::Module script_gpt(const Gpt& gpt);

}  // namespace gossamer::model
